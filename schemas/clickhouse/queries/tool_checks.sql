-- What the tool decisions did: requests whose tools route narrowed (tools offered and kept, on
-- average), requests refused for a tool their key may not offer (mask's: the door's 403s publish
-- nothing), calls generate found invalid or postprocess refused, and deployments skipped for a
-- tools request because they serve no tool calls.
SELECT
    (SELECT count() FROM decisions FINAL
     WHERE replay_id = '' AND stage = 'route.tools' AND finished >= {since:DateTime64(3)}) AS narrowed,
    (SELECT round(avg(scores['tools.offered']), 1) FROM decisions FINAL
     WHERE replay_id = '' AND stage = 'route.tools' AND finished >= {since:DateTime64(3)}) AS offered_avg,
    (SELECT round(avg(scores['tools.kept']), 1) FROM decisions FINAL
     WHERE replay_id = '' AND stage = 'route.tools' AND finished >= {since:DateTime64(3)}) AS kept_avg,
    (SELECT countIf(error_class = 'tool_not_allowed') FROM requests FINAL
     WHERE replay_id = '' AND finished >= {since:DateTime64(3)}) AS not_allowed,
    (SELECT countIf(error_class = 'tool_call_invalid') FROM requests FINAL
     WHERE replay_id = '' AND finished >= {since:DateTime64(3)}) AS invalid_calls,
    (SELECT countIf(error_class = 'tool_call_refused') FROM requests FINAL
     WHERE replay_id = '' AND finished >= {since:DateTime64(3)}) AS refused_calls,
    (SELECT count() FROM decisions FINAL
     WHERE replay_id = '' AND decision = 'refused' AND reason = 'incompatible: no tool calling'
       AND finished >= {since:DateTime64(3)}) AS deployments_skipped

-- Streamed answers: what the caller saw at the front door (request received -> first text chunk
-- written; the gaps between text chunks) beside the engine's own TTFT and time per output token
-- for the same requests, in ms. `ended`: ok, disconnected (the caller left: cancelled), or the
-- error class the stream ended with.
SELECT
    count() AS streamed,
    countIf(d.reason = 'disconnected') AS disconnected,
    round(quantile(0.5)(d.scores['caller_ttft_ms']), 1) AS caller_ttft_p50_ms,
    round(quantile(0.95)(d.scores['caller_ttft_ms']), 1) AS caller_ttft_p95_ms,
    round(quantile(0.5)(r.ttft_ms), 1) AS engine_ttft_p50_ms,
    round(quantile(0.95)(r.ttft_ms), 1) AS engine_ttft_p95_ms,
    round(quantileIf(0.5)(d.scores['chunk_gap_p50_ms'], mapContains(d.scores, 'chunk_gap_p50_ms')), 1) AS chunk_gap_p50_ms,
    round(quantileIf(0.95)(d.scores['chunk_gap_p95_ms'], mapContains(d.scores, 'chunk_gap_p95_ms')), 1) AS chunk_gap_p95_ms,
    round(quantile(0.5)(r.tpot_ms), 1) AS engine_tpot_p50_ms
FROM decisions AS d FINAL
LEFT JOIN (SELECT tenant_id, request_id, ttft_ms, tpot_ms FROM requests FINAL WHERE replay_id = '') AS r
    USING (tenant_id, request_id)
WHERE d.stage = 'frontdoor' AND d.decision = 'streamed' AND d.replay_id = '' AND d.finished >= {since:DateTime64(3)}

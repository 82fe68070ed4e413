-- Negative feedback on answers the cache served, per domain: a false-hit signal from callers, beside
-- the shadow estimate (cache_by_domain). Negative = a boolean metric answered false (the shipped
-- boolean metrics are higher-is-better; a float scale has no agreed "bad", so only booleans count).
-- Compare the share on hits with the same share on generated answers of the domain.
SELECT
    domain,
    countIf(cache = 'hit') AS judged_hits,
    countIf(cache = 'hit' AND value_float = 0) AS negative_on_hits,
    round(countIf(cache = 'hit' AND value_float = 0) / greatest(countIf(cache = 'hit'), 1), 4) AS negative_share_hits,
    countIf(cache != 'hit') AS judged_generated,
    round(countIf(cache != 'hit' AND value_float = 0) / greatest(countIf(cache != 'hit'), 1), 4)
        AS negative_share_generated
FROM feedback_joined
WHERE metric_type = 'boolean' AND target = 'request' AND feedback_at >= {since:DateTime64(3)}
GROUP BY domain
ORDER BY judged_hits DESC

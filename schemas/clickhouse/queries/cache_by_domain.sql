-- The cache per domain: lookups by decision, the hit rate, and the false-hit estimate. Shadow hits
-- are never served; postprocess compares each one's cached answer with the answer the model gave
-- (embedding similarity) and marks it `shadow_false_hit` below `shadow_agree_min`: the share of
-- shadow hits so marked estimates how often serving them would have been wrong.
SELECT
    c.domain AS domain,
    count() AS lookups,
    countIf(c.decision = 'hit') AS hits,
    countIf(c.decision = 'shadow_hit') AS shadow_hits,
    countIf(c.decision = 'miss') AS misses,
    countIf(c.decision = 'bypass') AS bypasses,
    round(countIf(c.decision = 'hit') / count(), 4) AS hit_rate,
    countIf(p.false_hit = 1) AS shadow_false_hits,
    round(countIf(p.false_hit = 1) / greatest(countIf(p.checked = 1), 1), 4) AS false_hit_estimate
FROM
(
    SELECT tenant_id, request_id, attempt, decision, labels['domain'] AS domain
    FROM decisions FINAL
    WHERE replay_id = '' AND stage = 'cache' AND step = 0 AND finished >= {since:DateTime64(3)}
) AS c
LEFT JOIN
(
    SELECT tenant_id, request_id, attempt, toUInt8(mapContains(scores, 'shadow_false_hit')) AS checked,
           toUInt8(scores['shadow_false_hit'] = 1) AS false_hit
    FROM decisions FINAL
    WHERE replay_id = '' AND stage = 'postprocess' AND step = 0 AND finished >= {since:DateTime64(3)}
) AS p ON p.tenant_id = c.tenant_id AND p.request_id = c.request_id AND p.attempt = c.attempt
GROUP BY domain
ORDER BY lookups DESC

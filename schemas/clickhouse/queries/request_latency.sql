-- Latency a caller saw, for answered (ok) requests: time to first token and per output token
-- (generated answers only) and end to end (every ok answer, cache hits included), in ms.
SELECT
    countIf(status = 'ok') AS ok,
    countIf(status = 'ok' AND ttft_ms IS NOT NULL) AS generated,
    round(quantileIf(0.5)(ttft_ms, status = 'ok'), 1) AS ttft_p50_ms,
    round(quantileIf(0.95)(ttft_ms, status = 'ok'), 1) AS ttft_p95_ms,
    round(quantileIf(0.5)(tpot_ms, status = 'ok'), 1) AS tpot_p50_ms,
    round(quantileIf(0.95)(tpot_ms, status = 'ok'), 1) AS tpot_p95_ms,
    round(quantileIf(0.5)(e2e_ms, status = 'ok'), 1) AS e2e_p50_ms,
    round(quantileIf(0.95)(e2e_ms, status = 'ok'), 1) AS e2e_p95_ms,
    round(quantileIf(0.99)(e2e_ms, status = 'ok'), 1) AS e2e_p99_ms
FROM requests FINAL
WHERE replay_id = '' AND finished >= {since:DateTime64(3)}

-- Per stage: records decided, queue and service time percentiles (ms), and throughput over the
-- window (records per second between the first and the last decision). Final decisions only
-- (step 0, no sub-decisions such as route.placement), original traffic only (no replays).
SELECT
    stage,
    count() AS records,
    uniqExact(worker) AS workers,
    round(quantile(0.5)(queue_ms), 2) AS queue_p50_ms,
    round(quantile(0.95)(queue_ms), 2) AS queue_p95_ms,
    round(quantile(0.5)(service_ms), 2) AS service_p50_ms,
    round(quantile(0.95)(service_ms), 2) AS service_p95_ms,
    round(count() / greatest(dateDiff('millisecond', min(started), max(finished)) / 1000, 0.001), 2) AS throughput_rps
FROM decisions FINAL
WHERE replay_id = '' AND step = 0 AND position(stage, '.') = 0 AND finished >= {since:DateTime64(3)}
GROUP BY stage
ORDER BY min(started)

-- The bottleneck. A stage's measured capacity is what its workers complete per second while busy:
-- per worker, records / busy seconds, where busy time is the union of the [started, finished]
-- intervals of its records (overlapping records of a concurrent or batching stage count once).
-- Summed over the stage's workers, divided by the share of requests that visit the stage (cache
-- hits skip the model, text skips media and vision), it is the request rate the stage can carry.
-- The pipeline's capacity is the smallest of these: the first row. Busy-time capacity is exact for
-- a saturated or serial stage and a lower bound for a batching stage that ran under-filled.
WITH
    d AS (
        SELECT stage, worker, started, finished, service_ms
        FROM decisions FINAL
        WHERE replay_id = '' AND step = 0 AND position(stage, '.') = 0 AND finished >= {since:DateTime64(3)}
    ),
    marked AS (
        SELECT stage, worker, started, finished, service_ms,
               max(finished) OVER (PARTITION BY stage, worker ORDER BY started, finished
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS busy_until
        FROM d
    ),
    periods AS (
        SELECT stage, worker, started, finished, service_ms,
               sum(toUInt32(started > busy_until)) OVER (PARTITION BY stage, worker ORDER BY started, finished
                                                         ROWS UNBOUNDED PRECEDING) AS period
        FROM marked
    ),
    busy AS (
        SELECT stage, worker, count() AS records,
               greatest(toFloat64(dateDiff('millisecond', min(started), max(finished))), max(service_ms)) AS busy_ms
        FROM periods
        GROUP BY stage, worker, period
    ),
    per_worker AS (
        SELECT stage, worker, sum(records) AS n, sum(busy_ms) AS worker_busy_ms
        FROM busy
        GROUP BY stage, worker
    ),
    per_stage AS (
        SELECT stage, uniqExact(worker) AS workers, sum(n) AS stage_records, sum(worker_busy_ms) AS stage_busy_ms,
               sum(n * 1000 / worker_busy_ms) AS stage_capacity
        FROM per_worker
        GROUP BY stage
    ),
    total AS (
        SELECT count() AS requests FROM requests FINAL WHERE replay_id = '' AND finished >= {since:DateTime64(3)}
    )
SELECT
    stage,
    workers,
    stage_records AS records,
    round(stage_busy_ms / 1000, 3) AS busy_s,
    round(stage_capacity / workers, 2) AS capacity_per_worker_rps,
    round(stage_capacity, 2) AS capacity_rps,
    round(stage_records / greatest(total.requests, 1), 4) AS visit_share,
    round(stage_capacity / greatest(stage_records / greatest(total.requests, 1), 0.0001), 2) AS request_capacity_rps
FROM per_stage, total
ORDER BY request_capacity_rps ASC

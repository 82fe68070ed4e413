-- RL operations in the window: rollout generation (samples, generated tokens per second over the
-- span the samples were made in, completion rate = samples made ÷ samples asked for) beside trainer
-- consumption (queue age = sample created -> consumed by a RolloutStream, the trainer's idle share =
-- waiting for samples ÷ waiting + working, stale samples dropped or flagged). Slow generation shows
-- as a high idle share with young samples, a trainer that cannot keep up as old samples.
WITH
    made AS (
        SELECT count() AS samples, sum(length(generated_token_ids)) AS tokens,
               dateDiff('millisecond', min(created_at), max(created_at)) / 1000 AS span_s
        FROM rollouts FINAL WHERE replay_id = '' AND created_at >= {since:DateTime64(3)}
    ),
    asked AS (
        SELECT sum(samples_requested) AS requested FROM requests FINAL
        WHERE replay_id = '' AND samples_requested > 0 AND finished >= {since:DateTime64(3)}
    ),
    took AS (
        SELECT sum(samples) AS consumed, sum(idle_ms) AS idle_ms, sum(busy_ms) AS busy_ms, sum(flagged) AS flagged,
               sum(arraySum(mapValues(dropped_by_revision))) AS dropped
        FROM rollout_consumption FINAL WHERE acked >= {since:DateTime64(3)}
    ),
    ages AS (
        SELECT quantile(0.5)(age) AS p50, quantile(0.95)(age) AS p95
        FROM rollout_consumption FINAL ARRAY JOIN queue_age_ms AS age WHERE acked >= {since:DateTime64(3)}
    )
SELECT made.samples AS rollout_samples, made.tokens AS generated_tokens,
       round(if(made.span_s > 0, made.tokens / made.span_s, nan), 1) AS generated_tokens_per_s,
       asked.requested AS samples_requested,
       round(if(asked.requested > 0, made.samples / asked.requested, nan), 4) AS sample_completion_rate,
       took.consumed AS consumed_samples, round(ages.p50, 1) AS queue_age_p50_ms, round(ages.p95, 1) AS queue_age_p95_ms,
       round(if(took.idle_ms + took.busy_ms > 0, took.idle_ms / (took.idle_ms + took.busy_ms), nan), 4)
           AS trainer_idle_share,
       took.dropped AS stale_dropped, took.flagged AS stale_flagged
FROM made, asked, took, ages

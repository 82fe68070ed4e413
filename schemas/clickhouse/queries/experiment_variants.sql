-- Experiments: per variant, the requests and episodes it served, their cost and latency, and each
-- numeric feedback metric's count, mean and 95 % confidence interval (mean ± 1.96 · s / √n, normal
-- approximation; boolean metrics count true as 1). Requests are the generated answers assigned in
-- the window (cache hits skip route and are in no experiment).
WITH
    served AS (
        SELECT experiment, variant, count() AS requests, uniqExact(episode_id) AS episodes,
               countIf(status = 'ok') AS ok, round(avg(cost_usd), 8) AS avg_cost_usd,
               round(sum(cost_usd), 6) AS total_cost_usd, round(quantile(0.5)(e2e_ms), 1) AS e2e_p50_ms,
               round(quantile(0.95)(e2e_ms), 1) AS e2e_p95_ms, round(quantile(0.5)(ttft_ms), 1) AS ttft_p50_ms
        FROM requests FINAL
        WHERE replay_id = '' AND experiment != '' AND finished >= {since:DateTime64(3)}
        GROUP BY experiment, variant
    ),
    judged AS (
        SELECT experiment, variant, metric, count() AS feedback, avg(value_float) AS mean,
               if(count() > 1, 1.96 * stddevSamp(value_float) / sqrt(count()), nan) AS half
        FROM feedback_joined
        WHERE experiment != '' AND value_float IS NOT NULL AND feedback_at >= {since:DateTime64(3)}
        GROUP BY experiment, variant, metric
    )
SELECT s.experiment AS experiment, s.variant AS variant, s.requests AS requests, s.episodes AS episodes,
       s.ok AS ok, s.avg_cost_usd AS avg_cost_usd, s.total_cost_usd AS total_cost_usd,
       s.e2e_p50_ms AS e2e_p50_ms, s.e2e_p95_ms AS e2e_p95_ms, s.ttft_p50_ms AS ttft_p50_ms,
       j.metric AS metric, j.feedback AS feedback, round(j.mean, 4) AS mean,
       round(j.mean - j.half, 4) AS ci95_low, round(j.mean + j.half, 4) AS ci95_high
FROM served AS s
LEFT JOIN judged AS j ON j.experiment = s.experiment AND j.variant = s.variant
ORDER BY experiment, variant, metric

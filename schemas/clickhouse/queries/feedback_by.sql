-- Numeric feedback by what made the answer: route, adapter, actor revision, deployment, cache
-- status, route policy version and experiment variant. One row per (dimension, value, metric): how
-- much feedback, its mean (boolean: the share of true) and the 95 % interval half-width.
SELECT dim.1 AS dimension, dim.2 AS value, metric, count() AS feedback, round(avg(value_float), 4) AS mean,
       round(if(count() > 1, 1.96 * stddevSamp(value_float) / sqrt(count()), nan), 4) AS ci95_half_width
FROM feedback_joined
ARRAY JOIN [('route', route), ('adapter', adapter), ('actor_revision', actor_revision), ('deployment', deployment),
            ('cache', cache), ('route_policy', route_policy_version), ('variant', concat(experiment, '/', variant))]
    AS dim
WHERE value_float IS NOT NULL AND feedback_at >= {since:DateTime64(3)} AND dim.2 NOT IN ('', '/')
GROUP BY dimension, value, metric
ORDER BY dimension, metric, feedback DESC

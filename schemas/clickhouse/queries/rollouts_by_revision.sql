-- Rollouts per actor revision: samples made and their mean score, samples trainers consumed and
-- dropped as stale, and how long after the revision went active on a replica its first sample
-- was made (seconds; the weight switch's cost to the trainer).
WITH
    made AS (
        SELECT actor_revision, count() AS samples, round(avg(score), 4) AS mean_score, min(created_at) AS first_sample
        FROM rollouts FINAL WHERE replay_id = '' AND created_at >= {since:DateTime64(3)}
        GROUP BY actor_revision
    ),
    took AS (
        SELECT rev, sum(n) AS consumed FROM rollout_consumption FINAL
        ARRAY JOIN mapKeys(samples_by_revision) AS rev, mapValues(samples_by_revision) AS n
        WHERE acked >= {since:DateTime64(3)} GROUP BY rev
    ),
    dropped AS (
        SELECT rev, sum(n) AS dropped FROM rollout_consumption FINAL
        ARRAY JOIN mapKeys(dropped_by_revision) AS rev, mapValues(dropped_by_revision) AS n
        WHERE acked >= {since:DateTime64(3)} GROUP BY rev
    ),
    active AS (
        SELECT revision, min(at) AS active_at FROM weight_events
        WHERE kind = 'actor' AND transition = 'active' GROUP BY revision
    )
SELECT made.actor_revision AS actor_revision, made.samples AS samples, made.mean_score AS mean_score,
       took.consumed AS consumed, dropped.dropped AS dropped_stale, made.first_sample AS first_sample,
       if(active.active_at IS NULL OR active.active_at = toDateTime64(0, 3), NULL,
          round(dateDiff('millisecond', active.active_at, made.first_sample) / 1000, 3)) AS activate_to_first_sample_s
FROM made
LEFT JOIN took ON took.rev = made.actor_revision
LEFT JOIN dropped ON dropped.rev = made.actor_revision
LEFT JOIN active ON active.revision = arrayElement(splitByString('+actor@', made.actor_revision), 2)
ORDER BY first_sample

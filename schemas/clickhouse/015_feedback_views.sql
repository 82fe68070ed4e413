-- Feedback joined to what it is about (issue 21). One row per (feedback, answered request): request
-- feedback joins its request, episode feedback joins every request of the episode of the same
-- tenant. Replays are left out. The route and cache policy versions come from their evidence.
CREATE VIEW IF NOT EXISTS feedback_joined AS
WITH
    f AS (SELECT * FROM feedback FINAL),
    r AS (SELECT * FROM requests FINAL WHERE replay_id = ''),
    pol AS (SELECT request_id, anyIf(policy_version, stage = 'route') AS route_policy_version,
                   anyIf(policy_version, stage = 'cache') AS cache_policy_version
            FROM decisions WHERE replay_id = '' AND stage IN ('route', 'cache') AND step = 0 GROUP BY request_id),
    joined AS (
        SELECT f.feedback_id AS feedback_id, f.tenant_id AS tenant_id, f.target AS target, f.metric AS metric,
               f.metric_type AS metric_type, f.value_float AS value_float, f.value_text AS value_text,
               f.created AS feedback_at, r.request_id AS request_id, r.episode_id AS episode_id
        FROM f INNER JOIN r ON r.tenant_id = f.tenant_id AND r.request_id = f.request_id
        WHERE f.target = 'request'
        UNION ALL
        SELECT f.feedback_id, f.tenant_id, f.target, f.metric, f.metric_type, f.value_float, f.value_text,
               f.created, r.request_id, r.episode_id
        FROM f INNER JOIN r ON r.tenant_id = f.tenant_id AND r.episode_id = f.episode_id
        WHERE f.target = 'episode'
    )
SELECT j.feedback_id AS feedback_id, j.tenant_id AS tenant_id, j.target AS target, j.metric AS metric,
       j.metric_type AS metric_type, j.value_float AS value_float, j.value_text AS value_text,
       j.feedback_at AS feedback_at, j.request_id AS request_id, j.episode_id AS episode_id, r.status AS status, r.route AS route, r.model AS model, r.adapter AS adapter,
       r.deployment AS deployment, r.actor_revision AS actor_revision, r.cache AS cache, r.domain AS domain,
       r.experiment AS experiment, r.variant AS variant, r.cost_usd AS cost_usd, r.e2e_ms AS e2e_ms,
       r.ttft_ms AS ttft_ms, pol.route_policy_version AS route_policy_version,
       pol.cache_policy_version AS cache_policy_version
FROM joined AS j
INNER JOIN r ON r.request_id = j.request_id
LEFT JOIN pol ON pol.request_id = j.request_id;

-- Served, generated answers with their feedback, as training material: token ids and logprobs where
-- the caller asked for logprobs, the actor (model revision + adapter) and the tokenizer and chat
-- template revisions that made them. `llmpipe rollouts export --from-feedback METRIC[>=X]` reads it.
CREATE VIEW IF NOT EXISTS training_candidates AS
WITH gen AS (
    SELECT request_id, any(revisions['tokenizer']) AS tokenizer_revision,
           any(revisions['chat_template']) AS chat_template_revision
    FROM decisions WHERE stage = 'generate' AND step = 0 AND replay_id = '' GROUP BY request_id
)
SELECT fj.feedback_id AS feedback_id, fj.metric AS metric, fj.metric_type AS metric_type,
       fj.value_float AS value_float, fj.value_text AS value_text, fj.target AS target, fj.feedback_at AS feedback_at,
       r.request_id AS request_id, r.tenant_id AS tenant_id, r.episode_id AS episode_id, r.route AS route,
       r.model AS model, r.adapter AS adapter, r.deployment AS deployment, r.actor_revision AS actor_revision,
       gen.tokenizer_revision AS tokenizer_revision, gen.chat_template_revision AS chat_template_revision,
       r.prompt_token_ids AS prompt_token_ids, r.token_ids AS generated_token_ids, r.logprobs AS logprobs,
       r.finished AS answered_at
FROM feedback_joined AS fj
INNER JOIN (SELECT * FROM requests FINAL WHERE replay_id = '') AS r ON r.request_id = fj.request_id
LEFT JOIN gen ON gen.request_id = r.request_id
WHERE r.status = 'ok' AND r.answered_by = 'postprocess' AND r.cache != 'hit' AND r.actor_revision != '';

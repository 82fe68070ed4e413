-- Identities are the tenant's (issue 35, findings 5 and 6): request ids and feedback ids are chosen
-- by callers, so two tenants may pick the same one. The dedup keys now start with tenant_id, so
-- another tenant's row with the same id is a row of its own and never replaces this tenant's.
-- ClickHouse cannot put an existing column in front of a sorting key, so each table is rebuilt:
-- copy every part (not FINAL: rows not merged yet, both tenants' included, are kept) into a table
-- with the new keys (the primary key named too: `AS` would copy the old one), then swap the two.
-- Each step may run again after a crash part-way: the leftover table is dropped first, and after
-- the swap it holds the old layout. The sink applies migrations before it consumes, so nothing is
-- written during the copy.

DROP TABLE IF EXISTS feedback_rekeyed;
CREATE TABLE feedback_rekeyed AS feedback
ENGINE = ReplacingMergeTree(inserted) PARTITION BY toYYYYMM(created) ORDER BY (tenant_id, feedback_id)
PRIMARY KEY (tenant_id, feedback_id);
INSERT INTO feedback_rekeyed SELECT * FROM feedback;
EXCHANGE TABLES feedback AND feedback_rekeyed;
DROP TABLE feedback_rekeyed;

DROP TABLE IF EXISTS requests_rekeyed;
CREATE TABLE requests_rekeyed AS requests
ENGINE = ReplacingMergeTree(inserted) PARTITION BY toYYYYMM(finished) ORDER BY (tenant_id, request_id, replay_id)
PRIMARY KEY (tenant_id, request_id, replay_id);
INSERT INTO requests_rekeyed SELECT * FROM requests;
EXCHANGE TABLES requests AND requests_rekeyed;
DROP TABLE requests_rekeyed;

-- a sample id is `<request_id>:<i>`: as caller-chosen as the request id
DROP TABLE IF EXISTS rollouts_rekeyed;
CREATE TABLE rollouts_rekeyed AS rollouts
ENGINE = ReplacingMergeTree(inserted) PARTITION BY toYYYYMM(created_at) ORDER BY (tenant_id, sample_id, replay_id)
PRIMARY KEY (tenant_id, sample_id, replay_id);
INSERT INTO rollouts_rekeyed SELECT * FROM rollouts;
EXCHANGE TABLES rollouts AND rollouts_rekeyed;
DROP TABLE rollouts_rekeyed;

-- evidence too: the feedback views read the route and cache policy of a request from it
DROP TABLE IF EXISTS decisions_rekeyed;
CREATE TABLE decisions_rekeyed AS decisions
ENGINE = ReplacingMergeTree(inserted) PARTITION BY toYYYYMM(finished)
ORDER BY (tenant_id, request_id, stage, attempt, replay_id, step)
PRIMARY KEY (tenant_id, request_id, stage, attempt, replay_id, step);
INSERT INTO decisions_rekeyed SELECT * FROM decisions;
EXCHANGE TABLES decisions AND decisions_rekeyed;
DROP TABLE decisions_rekeyed;

-- Every join from feedback to what it is about, and from an answer to its evidence, is on
-- (tenant_id, request_id): another tenant's request with the same id joins nothing of this one.
CREATE OR REPLACE VIEW feedback_joined AS
WITH
    f AS (SELECT * FROM feedback FINAL),
    r AS (SELECT * FROM requests FINAL WHERE replay_id = ''),
    pol AS (SELECT tenant_id, request_id, anyIf(policy_version, stage = 'route') AS route_policy_version,
                   anyIf(policy_version, stage = 'cache') AS cache_policy_version
            FROM decisions WHERE replay_id = '' AND stage IN ('route', 'cache') AND step = 0
            GROUP BY tenant_id, request_id),
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
       j.feedback_at AS feedback_at, j.request_id AS request_id, j.episode_id AS episode_id, r.status AS status,
       r.route AS route, r.model AS model, r.adapter AS adapter,
       r.deployment AS deployment, r.actor_revision AS actor_revision, r.cache AS cache, r.domain AS domain,
       r.experiment AS experiment, r.variant AS variant, r.cost_usd AS cost_usd, r.e2e_ms AS e2e_ms,
       r.ttft_ms AS ttft_ms, pol.route_policy_version AS route_policy_version,
       pol.cache_policy_version AS cache_policy_version
FROM joined AS j
INNER JOIN r ON r.tenant_id = j.tenant_id AND r.request_id = j.request_id
LEFT JOIN pol ON pol.tenant_id = j.tenant_id AND pol.request_id = j.request_id;

CREATE OR REPLACE VIEW training_candidates AS
WITH gen AS (
    SELECT tenant_id, request_id, any(revisions['tokenizer']) AS tokenizer_revision,
           any(revisions['chat_template']) AS chat_template_revision
    FROM decisions WHERE stage = 'generate' AND step = 0 AND replay_id = '' GROUP BY tenant_id, request_id
)
SELECT fj.feedback_id AS feedback_id, fj.metric AS metric, fj.metric_type AS metric_type,
       fj.value_float AS value_float, fj.value_text AS value_text, fj.target AS target, fj.feedback_at AS feedback_at,
       r.request_id AS request_id, r.tenant_id AS tenant_id, r.episode_id AS episode_id, r.route AS route,
       r.model AS model, r.adapter AS adapter, r.deployment AS deployment, r.actor_revision AS actor_revision,
       gen.tokenizer_revision AS tokenizer_revision, gen.chat_template_revision AS chat_template_revision,
       r.prompt_token_ids AS prompt_token_ids, r.token_ids AS generated_token_ids, r.logprobs AS logprobs,
       r.finished AS answered_at
FROM feedback_joined AS fj
INNER JOIN (SELECT * FROM requests FINAL WHERE replay_id = '') AS r
    ON r.tenant_id = fj.tenant_id AND r.request_id = fj.request_id
LEFT JOIN gen ON gen.tenant_id = r.tenant_id AND gen.request_id = r.request_id
WHERE r.status = 'ok' AND r.answered_by = 'postprocess' AND r.cache != 'hit' AND r.actor_revision != '';

-- A group id is the caller's too: a group's baseline is taken over its own tenant's samples only.
CREATE OR REPLACE VIEW training_samples AS
SELECT
    sample_id, group_id, request_id, tenant_id, actor_revision, prompt_dataset_revision, reward_revision,
    verifier_revision, reference_revision, tokenizer_revision, chat_template_revision, temperature,
    top_p, max_tokens, seed, prompt_token_ids, generated_token_ids, logprobs, finish_reason, score,
    avg(score) OVER (PARTITION BY tenant_id, group_id, actor_revision) AS group_mean_score,
    score - group_mean_score AS advantage,
    count() OVER (PARTITION BY tenant_id, group_id, actor_revision) AS group_size,
    arrayElement(splitByString('+actor@', actor_revision), 2) AS actor_weights,
    actor_weights != '' AND actor_weights IN (
        SELECT revision FROM weight_events WHERE kind = 'actor' AND transition = 'rejected') AS rejected,
    runtime, hardware, batch_context, created_at
FROM rollouts FINAL
WHERE replay_id = '' AND score IS NOT NULL

-- One row per RL sample with full provenance. Dedup key: sample_id.
CREATE TABLE IF NOT EXISTS rollouts
(
    sample_id                 String,
    group_id                  String,
    request_id                String,
    tenant_id                 LowCardinality(String),
    prompt_dataset_revision   LowCardinality(String),
    actor_revision            LowCardinality(String),
    reward_revision           LowCardinality(String),
    verifier_revision         LowCardinality(String),
    reference_revision        LowCardinality(String),
    tokenizer_revision        LowCardinality(String),
    chat_template_revision    LowCardinality(String),
    temperature               Float64,
    top_p                     Float64,
    max_tokens                UInt32,
    seed                      Nullable(Int64),
    runtime                   LowCardinality(String),
    hardware                  LowCardinality(String),
    batch_context             String,
    prompt_token_ids          Array(UInt32),
    generated_token_ids       Array(UInt32),
    logprobs                  Array(Float64),
    finish_reason             LowCardinality(String),
    score                     Nullable(Float64),
    created_at                DateTime64(3, 'UTC'),
    replay_id                 String,
    inserted                  DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
PARTITION BY toYYYYMM(created_at)
ORDER BY (sample_id, replay_id)

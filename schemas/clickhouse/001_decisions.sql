-- One row per stage decision. Replays write rows with their replay_id (shadow=1 in shadow mode),
-- so a replay never replaces the original evidence. Dedup key: (request_id, stage, attempt, replay_id).
CREATE TABLE IF NOT EXISTS decisions
(
    request_id      String,
    tenant_id       LowCardinality(String),
    stage           LowCardinality(String),
    decision        LowCardinality(String),
    reason          String,
    policy_version  LowCardinality(String),
    revisions       Map(String, String),
    scores          Map(String, Float64),
    candidates      Array(String),
    attempt         UInt32,
    worker          LowCardinality(String),
    partition       Int32,
    offset          Int64,
    enqueued        DateTime64(3, 'UTC'),
    started         DateTime64(3, 'UTC'),
    finished        DateTime64(3, 'UTC'),
    queue_ms        Float64,
    service_ms      Float64,
    replay_id       String,
    shadow          UInt8,
    inserted        DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
PARTITION BY toYYYYMM(finished)
ORDER BY (request_id, stage, attempt, replay_id)

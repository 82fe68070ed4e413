-- One row per finished request (the terminal answer). Dedup key: (request_id, replay_id).
CREATE TABLE IF NOT EXISTS requests
(
    request_id          String,
    tenant_id           LowCardinality(String),
    status              LowCardinality(String),
    error_class         LowCardinality(String),
    answered_by         LowCardinality(String),
    route               LowCardinality(String),
    model               LowCardinality(String),
    adapter             LowCardinality(String),
    placement           LowCardinality(String),
    cache               LowCardinality(String),
    tokens_in           UInt32,
    tokens_out          UInt32,
    cost_usd            Float64,
    ttft_ms             Nullable(Float64),
    tpot_ms             Nullable(Float64),
    e2e_ms              Nullable(Float64),
    stage_queue_ms      Map(String, Float64),
    stage_service_ms    Map(String, Float64),
    created             DateTime64(3, 'UTC'),
    finished            DateTime64(3, 'UTC'),
    replay_id           String,
    inserted            DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
PARTITION BY toYYYYMM(finished)
ORDER BY (request_id, replay_id)

-- What callers said about answers and episodes (issue 21), checked and masked by the feedback
-- worker. One row per feedback_id: a repeat of the same id (a retry, a duplicate publish) replaces
-- itself. Text values are masked like prompts, and the giver's key is never stored.
CREATE TABLE IF NOT EXISTS feedback
(
    feedback_id   String,
    tenant_id     LowCardinality(String),
    target        LowCardinality(String),   -- request | episode
    request_id    String,
    episode_id    String,
    metric        LowCardinality(String),
    metric_type   LowCardinality(String),   -- boolean | float | text (comment, demonstration)
    value_float   Nullable(Float64),        -- boolean: 1 / 0, float: the number
    value_text    String,                   -- comment, demonstration (masked)
    created       DateTime64(3, 'UTC'),
    inserted      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
PARTITION BY toYYYYMM(created)
ORDER BY feedback_id

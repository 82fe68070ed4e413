-- Actor/adapter weight lifecycle transitions per replica (written by the adapter registry).
CREATE TABLE IF NOT EXISTS weight_events
(
    event_id        String,
    replica         LowCardinality(String),
    kind            LowCardinality(String),
    name            String,
    revision        String,
    transition      LowCardinality(String),
    detail          String,
    at              DateTime64(3, 'UTC'),
    inserted        DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
ORDER BY (event_id)

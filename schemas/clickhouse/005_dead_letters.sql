-- Where and why records were dead-lettered. The payload stays in the Kafka `dlq` topic only:
-- it may hold unmasked text, which never reaches the warehouse.
CREATE TABLE IF NOT EXISTS dead_letters
(
    topic           String,
    partition       Int32,
    offset          Int64,
    stage           LowCardinality(String),
    worker          LowCardinality(String),
    error_class     LowCardinality(String),
    attempts        UInt32,
    request_id      String,
    tenant_id       LowCardinality(String),
    failed          DateTime64(3, 'UTC'),
    inserted        DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
ORDER BY (topic, partition, offset, stage)

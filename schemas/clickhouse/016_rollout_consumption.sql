-- What trainers acknowledged (issue 21): one row per batch a RolloutStream handed over and got back.
-- queue_age_ms holds every sample's age when consumed (created -> consumed), so percentiles are
-- exact. idle_ms: the trainer waited for samples. busy_ms: it worked on the batch.
CREATE TABLE IF NOT EXISTS rollout_consumption
(
    batch_id             String,
    trainer              LowCardinality(String),
    groups               UInt32,
    samples              UInt32,
    idle_ms              Float64,
    busy_ms              Float64,
    queue_age_ms         Array(Float64),
    samples_by_revision  Map(String, UInt32),
    stale_by_revision    Map(String, UInt32),
    dropped_by_revision  Map(String, UInt32),
    flagged              UInt32,
    incomplete           UInt32,
    active_revision      String,
    acked                DateTime64(3, 'UTC'),
    inserted             DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
PARTITION BY toYYYYMM(acked)
ORDER BY (trainer, batch_id);

-- The samples a rollout request asked for (n), on its terminal row whether or not they came: the
-- denominator of the sample completion rate.
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS samples_requested UInt32 DEFAULT 0

-- Episodes and experiments (issue 21): the episode a request belongs to, on every table that a
-- feedback join or a per-episode analysis reads, and the experiment variant a request ran under.
ALTER TABLE decisions
    ADD COLUMN IF NOT EXISTS episode_id String DEFAULT '' AFTER tenant_id;
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS episode_id String DEFAULT '' AFTER tenant_id,
    ADD COLUMN IF NOT EXISTS experiment LowCardinality(String) DEFAULT '' AFTER adapter,
    ADD COLUMN IF NOT EXISTS variant LowCardinality(String) DEFAULT '' AFTER experiment;
ALTER TABLE rollouts
    ADD COLUMN IF NOT EXISTS episode_id String DEFAULT '' AFTER tenant_id;

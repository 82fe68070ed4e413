-- What the analyst report groups by: categorical facts of a decision (e.g. the cache's domain and
-- mode) as `labels`, and per request the model the caller asked for and the cache domain, next to
-- the model that ran.
ALTER TABLE decisions
    ADD COLUMN IF NOT EXISTS labels Map(String, String) AFTER candidates;
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS requested_model LowCardinality(String) AFTER model,
    ADD COLUMN IF NOT EXISTS domain LowCardinality(String) AFTER cache;

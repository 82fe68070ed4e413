-- A weight transition's duration (an adapter load, an actor validation) and the request that
-- caused it, so load times and the TTFT they added can be joined to `requests`.
ALTER TABLE weight_events
    ADD COLUMN IF NOT EXISTS duration_ms Nullable(Float64) AFTER detail,
    ADD COLUMN IF NOT EXISTS request_id String AFTER duration_ms;

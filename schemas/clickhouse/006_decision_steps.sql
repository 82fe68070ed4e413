-- A stage may record several decisions for one request attempt: generate writes one row per engine
-- attempt (retries and fallbacks) besides its final row. `step` numbers them (0 = the stage's final
-- decision) and joins the dedup key, so attempts never replace each other.
ALTER TABLE decisions
    ADD COLUMN IF NOT EXISTS step UInt16 AFTER attempt,
    MODIFY ORDER BY (request_id, stage, attempt, replay_id, step);

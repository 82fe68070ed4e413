-- The shape of a request's images as media decoded them (never their content): analysts can ask
-- what image traffic costs (decode time, bytes, pixels) next to tokens and latency.
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS image_count UInt16 AFTER replay_id,
    ADD COLUMN IF NOT EXISTS image_bytes UInt64 AFTER image_count,
    ADD COLUMN IF NOT EXISTS image_max_pixels UInt64 AFTER image_bytes,
    ADD COLUMN IF NOT EXISTS image_decode_ms Float64 AFTER image_max_pixels;

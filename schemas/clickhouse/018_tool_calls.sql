-- Tool calls (issue 39): the names of the tools an answer called, over all its choices, for the
-- report's tool sections. An answer without calls has none.
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS tool_calls Array(LowCardinality(String)) AFTER samples_requested;

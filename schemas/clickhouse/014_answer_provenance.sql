-- What a served answer is made of, for training from feedback (issue 21): the deployment and the
-- actor revision (model revision + adapter) that generated it, and, when the caller asked for
-- logprobs, the prompt and generated token ids with their logprobs.
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS deployment LowCardinality(String) DEFAULT '' AFTER adapter,
    ADD COLUMN IF NOT EXISTS actor_revision String DEFAULT '' AFTER deployment,
    ADD COLUMN IF NOT EXISTS prompt_token_ids Array(UInt32) DEFAULT [],
    ADD COLUMN IF NOT EXISTS token_ids Array(UInt32) DEFAULT [],
    ADD COLUMN IF NOT EXISTS logprobs Array(Float64) DEFAULT [];

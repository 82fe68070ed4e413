"""The warehouse sink, a worker beside the stages: every evidence, response, rollout, feedback and
dead-letter record into its ClickHouse table (`warehouse`), committed only after the insert."""

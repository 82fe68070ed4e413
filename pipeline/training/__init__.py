"""What RL trainers use: `samples` (prompts in as rollout requests, scored samples out of the
warehouse as export files) and `stream` (`RolloutStream`: live sample groups from the `rollouts`
topic, committed only when the trainer acknowledges them). Sampling itself is generate's
(`stages/generate/rollouts/`)."""

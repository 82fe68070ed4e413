-- Training-ready samples: one row per rollout sample of a live run (replays excluded), with the
-- group's baseline and the sample's advantage (score minus its group's mean score over the samples
-- of the same actor revision: GRPO's normalisation without the std). Trainers read this view, or
-- `llmpipe rollouts export`, which reads it.
CREATE VIEW IF NOT EXISTS training_samples AS
SELECT
    sample_id, group_id, request_id, actor_revision, prompt_dataset_revision, reward_revision,
    verifier_revision, reference_revision, tokenizer_revision, chat_template_revision, temperature,
    top_p, max_tokens, seed, prompt_token_ids, generated_token_ids, logprobs, finish_reason, score,
    avg(score) OVER (PARTITION BY group_id, actor_revision) AS group_mean_score,
    score - group_mean_score AS advantage,
    count() OVER (PARTITION BY group_id, actor_revision) AS group_size,
    runtime, hardware, batch_context, created_at
FROM rollouts FINAL
WHERE replay_id = '' AND score IS NOT NULL

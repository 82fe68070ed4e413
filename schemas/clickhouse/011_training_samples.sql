-- Training-ready samples: one row per rollout sample of a live run (replays excluded), with the
-- group's baseline and the sample's advantage (score minus its group's mean score over the samples
-- of the same actor revision: GRPO's normalisation without the std), and `rejected` = the sample
-- came from an actor revision that was rolled back (`llmpipe actor rollback` writes a
-- weight_events row with transition 'rejected'). Trainers read this view, or
-- `llmpipe rollouts export`, which reads it and leaves rejected samples out unless asked.
CREATE VIEW IF NOT EXISTS training_samples AS
SELECT
    sample_id, group_id, request_id, actor_revision, prompt_dataset_revision, reward_revision,
    verifier_revision, reference_revision, tokenizer_revision, chat_template_revision, temperature,
    top_p, max_tokens, seed, prompt_token_ids, generated_token_ids, logprobs, finish_reason, score,
    avg(score) OVER (PARTITION BY group_id, actor_revision) AS group_mean_score,
    score - group_mean_score AS advantage,
    count() OVER (PARTITION BY group_id, actor_revision) AS group_size,
    arrayElement(splitByString('+actor@', actor_revision), 2) AS actor_weights,
    actor_weights != '' AND actor_weights IN (
        SELECT revision FROM weight_events WHERE kind = 'actor' AND transition = 'rejected') AS rejected,
    runtime, hardware, batch_context, created_at
FROM rollouts FINAL
WHERE replay_id = '' AND score IS NOT NULL

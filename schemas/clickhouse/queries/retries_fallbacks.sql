-- What retries and fallbacks cost: generate's final decisions that needed more than one engine
-- attempt, the latency the failed attempts and waits added, and the prompt tokens sent again.
SELECT
    count() AS generated,
    countIf(scores['attempts'] > 1) AS retried,
    countIf(decision = 'generated' AND scores['attempts'] > 1) AS recovered,
    countIf(decision = 'failed') AS failed,
    round(sumIf(scores['added_latency_ms'], scores['attempts'] > 1), 1) AS added_latency_ms,
    round(quantileIf(0.95)(scores['added_latency_ms'], scores['attempts'] > 1), 1) AS added_latency_p95_ms,
    toUInt64(sumIf(scores['tokens_in'] * (scores['attempts'] - 1), scores['attempts'] > 1)) AS resent_tokens
FROM decisions FINAL
WHERE replay_id = '' AND stage = 'generate' AND step = 0 AND finished >= {since:DateTime64(3)}

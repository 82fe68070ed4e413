-- Which routes requests took, what they cost and how many tokens they used (all finished requests;
-- cache hits skip route and the model).
SELECT
    if(route != '', route, if(cache = 'hit', '(cache hit)', '(refused before route)')) AS route_name,
    count() AS requests,
    round(count() / sum(count()) OVER (), 4) AS share,
    countIf(status = 'ok') AS ok,
    sum(tokens_in) AS total_tokens_in,
    sum(tokens_out) AS total_tokens_out,
    round(sum(cost_usd), 6) AS total_cost_usd,
    round(avg(cost_usd), 8) AS avg_cost_usd
FROM requests FINAL
WHERE replay_id = '' AND finished >= {since:DateTime64(3)}
GROUP BY route_name
ORDER BY requests DESC

-- The model the caller asked for next to the model that ran it.
SELECT
    if(requested_model = '', '(none)', requested_model) AS requested,
    if(model != '', model, if(cache = 'hit', '(cache hit)', '(not run)')) AS executed,
    count() AS requests
FROM requests FINAL
WHERE replay_id = '' AND finished >= {since:DateTime64(3)}
GROUP BY requested, executed
ORDER BY requests DESC

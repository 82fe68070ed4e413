-- Requests that were not answered ok, by status, class and the stage that answered them.
SELECT status, error_class, answered_by, count() AS requests
FROM requests FINAL
WHERE replay_id = '' AND status != 'ok' AND finished >= {since:DateTime64(3)}
GROUP BY status, error_class, answered_by
ORDER BY requests DESC

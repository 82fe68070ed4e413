-- Events of the stack itself, not of a request: the embedded broker restarted (its memory storage
-- lost the records in flight, so those requests got no pipeline answer), a worker process was
-- restarted by the supervisor. Newest first; `reason` says what it meant for callers.
SELECT
    stage,
    decision,
    labels['worker'] AS worker,
    labels['exit_code'] AS exit_code,
    finished AS at,
    reason
FROM decisions FINAL
WHERE replay_id = '' AND startsWith(stage, 'stack.') AND finished >= {since:DateTime64(3)}
ORDER BY finished DESC
LIMIT 100

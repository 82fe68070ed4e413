-- Tool calls the answers carried, by tool, tenant and route (an answer calling two tools counts
-- once for each).
SELECT tool, tenant_id, route, count() AS calls, uniqExact(request_id) AS requests
FROM requests FINAL
ARRAY JOIN tool_calls AS tool
WHERE replay_id = '' AND finished >= {since:DateTime64(3)}
GROUP BY tool, tenant_id, route
ORDER BY calls DESC, tool
LIMIT 50

-- Counts open sub-tasks and reads the next deadline.
SELECT count(*) AS count_1, min(agent_peer_sub_tasks.timeout_deadline) AS min_1
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND status IN ('pending', 'claimed');

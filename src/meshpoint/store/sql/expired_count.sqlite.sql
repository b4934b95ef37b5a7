-- Counts open sub-tasks whose deadline passed.
SELECT count(*) AS count_1
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND status IN ('pending', 'claimed')
  AND agent_peer_sub_tasks.timeout_deadline <= :p_now
  AND agent_peer_sub_tasks.timeout_deadline >= (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001;

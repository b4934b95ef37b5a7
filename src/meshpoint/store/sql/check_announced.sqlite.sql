-- Takes up to p_limit of an agent's pending sub-tasks whose announcement check is due: their deadline becomes their timeout's, and they are returned to be published again.
WITH unchecked AS MATERIALIZED
  (SELECT agent_peer_sub_tasks.tenant_id AS tenant_id,
     agent_peer_sub_tasks.sub_task_id AS sub_task_id
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
     AND agent_peer_sub_tasks.agent_name = :p_agent
     AND status IN ('pending', 'claimed')
     AND agent_peer_sub_tasks.timeout_deadline <= :p_now
     AND agent_peer_sub_tasks.status = 'pending'
     AND agent_peer_sub_tasks.timeout_deadline < (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001
   ORDER BY agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.sub_task_id
   LIMIT :p_limit
   OFFSET 0)
UPDATE agent_peer_sub_tasks
SET timeout_deadline=(agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s)
WHERE (agent_peer_sub_tasks.tenant_id, agent_peer_sub_tasks.sub_task_id) IN
    (SELECT unchecked.tenant_id, unchecked.sub_task_id
     FROM unchecked) RETURNING sub_task_id, logical_task_id, agent_name, invocation_id, function_call_id, peer_agent_name,
  peer_task_id, correlation_data, timeout_deadline, status, resolved_by, result;

-- Resolves up to p_limit of an agent's open sub-tasks whose deadline passed with the timeout result.
WITH expired AS MATERIALIZED
  (SELECT agent_peer_sub_tasks.tenant_id AS tenant_id,
     agent_peer_sub_tasks.sub_task_id AS sub_task_id
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
     AND agent_peer_sub_tasks.agent_name = :p_agent
     AND status IN ('pending', 'claimed')
     AND agent_peer_sub_tasks.timeout_deadline <= :p_now
     AND agent_peer_sub_tasks.timeout_deadline >= (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001
   ORDER BY agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.sub_task_id
   LIMIT :p_limit
   OFFSET 0)
UPDATE agent_peer_sub_tasks
SET status='resolved', resolved_by='timeout', result=:p_result, resolved_at=:p_now
WHERE (agent_peer_sub_tasks.tenant_id, agent_peer_sub_tasks.sub_task_id) IN
    (SELECT expired.tenant_id, expired.sub_task_id
     FROM expired) RETURNING sub_task_id, logical_task_id, agent_name, invocation_id, function_call_id, peer_agent_name,
  peer_task_id, correlation_data, timeout_deadline, status, resolved_by, result;

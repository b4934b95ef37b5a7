-- Resolves up to p_limit of an agent's open sub-tasks whose deadline passed with the timeout result.
WITH expired AS MATERIALIZED
  (SELECT agent_peer_sub_tasks.tenant_id AS tenant_id,
     agent_peer_sub_tasks.sub_task_id AS sub_task_id
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_peer_sub_tasks.agent_name = :p_agent::VARCHAR
     AND status IN ('pending', 'claimed')
     AND agent_peer_sub_tasks.timeout_deadline <= :p_now::FLOAT
     AND agent_peer_sub_tasks.timeout_deadline >= (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001
   ORDER BY agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.sub_task_id
   LIMIT :p_limit::INTEGER
   FOR UPDATE SKIP LOCKED)
UPDATE agent_peer_sub_tasks
SET status='resolved', resolved_by='timeout', result=:p_result::JSON, resolved_at=:p_now::FLOAT
WHERE (agent_peer_sub_tasks.tenant_id, agent_peer_sub_tasks.sub_task_id) IN
    (SELECT expired.tenant_id, expired.sub_task_id
     FROM expired) RETURNING agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.logical_task_id,
  agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id, agent_peer_sub_tasks.function_call_id,
  agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id, agent_peer_sub_tasks.correlation_data,
  agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.status, agent_peer_sub_tasks.resolved_by,
  agent_peer_sub_tasks.result;

-- Reads the results recorded on an invocation's sub-tasks.
SELECT agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.function_call_id,
  agent_peer_sub_tasks.result
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_peer_sub_tasks.invocation_id = :p_invocation::VARCHAR
  AND agent_peer_sub_tasks.status = 'resolved';

-- Reads every sub-task of a task.
SELECT agent_peer_sub_tasks.tenant_id, agent_peer_sub_tasks.sub_task_id,
  agent_peer_sub_tasks.logical_task_id, agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id,
  agent_peer_sub_tasks.function_call_id, agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id,
  agent_peer_sub_tasks.correlation_data, agent_peer_sub_tasks.timeout_s, agent_peer_sub_tasks.timeout_deadline,
  agent_peer_sub_tasks.status, agent_peer_sub_tasks.resolved_by, agent_peer_sub_tasks.result,
  agent_peer_sub_tasks.resolved_at, agent_peer_sub_tasks.created_at
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
ORDER BY agent_peer_sub_tasks.sub_task_id;

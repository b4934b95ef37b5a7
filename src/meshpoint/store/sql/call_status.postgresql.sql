-- Reads the status and id of a call's sub-task.
SELECT agent_peer_sub_tasks.status, agent_peer_sub_tasks.sub_task_id
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_peer_sub_tasks.invocation_id = :p_invocation::VARCHAR
  AND agent_peer_sub_tasks.function_call_id = :p_call::VARCHAR;

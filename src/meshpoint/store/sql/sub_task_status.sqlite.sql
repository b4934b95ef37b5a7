-- Reads a sub-task's status and the agent of its task.
SELECT agent_peer_sub_tasks.status, agent_peer_sub_tasks.agent_name
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.sub_task_id = :p_sub;

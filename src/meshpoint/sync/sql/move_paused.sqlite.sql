-- Lists the tenant's paused tasks (their ids, agents and statuses).
SELECT agent_paused_tasks.logical_task_id, agent_paused_tasks.agent_name,
  agent_paused_tasks.status
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant
ORDER BY agent_paused_tasks.logical_task_id;

-- Forgets an agent's tasks that ended before p_before.
DELETE
FROM agent_ended_tasks
WHERE agent_ended_tasks.agent_name = :p_agent
  AND agent_ended_tasks.tenant_id = :p_tenant
  AND agent_ended_tasks.ended_at < :p_before RETURNING logical_task_id;

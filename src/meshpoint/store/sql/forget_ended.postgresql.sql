-- Forgets an agent's tasks that ended before p_before.
DELETE
FROM agent_ended_tasks
WHERE agent_ended_tasks.agent_name = :p_agent::VARCHAR
  AND agent_ended_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_ended_tasks.ended_at < :p_before::FLOAT RETURNING agent_ended_tasks.logical_task_id;

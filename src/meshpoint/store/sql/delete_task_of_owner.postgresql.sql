-- Deletes a task's row if the caller holds its lease.
DELETE
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_paused_tasks.owner = :p_owner::VARCHAR RETURNING agent_paused_tasks.agent_name;

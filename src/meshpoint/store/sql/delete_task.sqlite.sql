-- Deletes a task's row.
DELETE
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task RETURNING agent_name;

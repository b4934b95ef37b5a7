-- Deletes a task's row if the caller holds its lease.
DELETE
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task
  AND agent_paused_tasks.owner = :p_owner RETURNING agent_name;

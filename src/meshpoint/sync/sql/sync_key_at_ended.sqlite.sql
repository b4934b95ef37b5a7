-- Reads the key of the row of agent_ended_tasks at a position.
SELECT agent_ended_tasks.logical_task_id
FROM agent_ended_tasks
WHERE agent_ended_tasks.tenant_id = :p_tenant
  AND rowid = :p_after;

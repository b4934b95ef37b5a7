-- Reads the next rows of agent_ended_tasks after a position, in commit order (rowid).
SELECT rowid AS sync_rowid, agent_ended_tasks.tenant_id, agent_ended_tasks.logical_task_id,
  agent_ended_tasks.agent_name, agent_ended_tasks.ended_at
FROM agent_ended_tasks
WHERE agent_ended_tasks.tenant_id = :p_tenant
  AND rowid > :p_after
ORDER BY rowid
LIMIT :p_limit
OFFSET 0;

-- Counts the rows of agent_ended_tasks after a position.
SELECT count(*) AS count_1
FROM agent_ended_tasks
WHERE agent_ended_tasks.tenant_id = :p_tenant
  AND rowid > :p_after;

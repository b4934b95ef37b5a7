-- Counts the rows of agent_checkpoints after a position.
SELECT count(*) AS count_1
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant
  AND rowid > :p_after;

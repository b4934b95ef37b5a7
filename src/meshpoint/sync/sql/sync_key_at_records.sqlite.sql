-- Reads the key of the row of agent_checkpoints at a position.
SELECT agent_checkpoints.checkpoint_id
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant
  AND rowid = :p_after;

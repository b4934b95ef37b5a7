-- Reads the next rows of agent_checkpoints after a position, in commit order (rowid).
SELECT rowid AS sync_rowid, agent_checkpoints.tenant_id, agent_checkpoints.checkpoint_id,
  agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.agent_name, agent_checkpoints.agent_type,
  agent_checkpoints.iteration, agent_checkpoints.phase, agent_checkpoints.parent_id, agent_checkpoints.data,
  agent_checkpoints.snapshot, agent_checkpoints.snapshot_encoding, agent_checkpoints.hash, agent_checkpoints.signature,
  agent_checkpoints.key_id, agent_checkpoints.retention_policy, agent_checkpoints.created_at
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant
  AND rowid > :p_after
ORDER BY rowid
LIMIT :p_limit
OFFSET 0;

-- Reads a task's history records, oldest first, with their snapshots.
SELECT agent_checkpoints.tenant_id, agent_checkpoints.checkpoint_id,
  agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.data, agent_checkpoints.hash,
  agent_checkpoints.signature, agent_checkpoints.key_id, agent_checkpoints.snapshot, agent_checkpoints.snapshot_encoding
FROM agent_checkpoints
WHERE agent_checkpoints.logical_task_id = :p_task
  AND agent_checkpoints.tenant_id = :p_tenant
ORDER BY agent_checkpoints.seq;

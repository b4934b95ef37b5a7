-- Reads the cloud's record at one place of a task's chain.
SELECT agent_checkpoints.tenant_id, agent_checkpoints.checkpoint_id,
  agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.agent_name, agent_checkpoints.agent_type,
  agent_checkpoints.iteration, agent_checkpoints.phase, agent_checkpoints.parent_id, agent_checkpoints.data,
  agent_checkpoints.snapshot, agent_checkpoints.snapshot_encoding, agent_checkpoints.hash, agent_checkpoints.signature,
  agent_checkpoints.key_id, agent_checkpoints.retention_policy, agent_checkpoints.created_at
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoints.logical_task_id = :p_logical_task_id::VARCHAR
  AND agent_checkpoints.seq = :p_seq::INTEGER;

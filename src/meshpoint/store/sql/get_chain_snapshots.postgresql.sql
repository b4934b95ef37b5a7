-- Reads the snapshots of a task's history records by position.
SELECT agent_checkpoints.seq, agent_checkpoints.snapshot, agent_checkpoints.snapshot_encoding
FROM agent_checkpoints
WHERE agent_checkpoints.logical_task_id = :p_task::VARCHAR
  AND agent_checkpoints.tenant_id = :p_tenant::VARCHAR
ORDER BY agent_checkpoints.seq;

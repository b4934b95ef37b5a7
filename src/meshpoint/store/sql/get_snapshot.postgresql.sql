-- Reads the snapshot stored with a history record.
SELECT agent_checkpoints.snapshot, agent_checkpoints.snapshot_encoding
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoints.checkpoint_id = :p_rec_id::VARCHAR;

-- Inserts a verified history record (a taken id or place fails the statement: the batch is then applied chain by chain).
INSERT INTO agent_checkpoints (
               tenant_id, checkpoint_id, logical_task_id, seq, agent_name, agent_type, iteration,
               phase, parent_id, data, snapshot, snapshot_encoding, hash, signature, key_id,
               retention_policy, created_at)
VALUES (:p_tenant::VARCHAR, :p_checkpoint_id::VARCHAR, :p_logical_task_id::VARCHAR, :p_seq::INTEGER, :p_agent_name::VARCHAR, :p_agent_type::VARCHAR, :p_iteration::INTEGER, :p_phase::VARCHAR, :p_parent_id::VARCHAR, :p_data::JSONB, :p_snapshot::BYTEA, :p_snapshot_encoding::VARCHAR, :p_hash::VARCHAR, :p_signature::VARCHAR, :p_key_id::VARCHAR, :p_retention_policy::VARCHAR, :p_created_at::FLOAT);

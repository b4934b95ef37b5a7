-- Inserts a history record of the task's checkpoint or end.
INSERT INTO agent_checkpoints (
               tenant_id, checkpoint_id, logical_task_id, seq, agent_name, agent_type, iteration,
               phase, parent_id, data, snapshot, snapshot_encoding, hash, signature, key_id,
               retention_policy, created_at)
SELECT :p_tenant::VARCHAR AS anon_1, :p_rec_id::VARCHAR AS anon_2, :p_task::VARCHAR AS anon_3,
  :p_rec_seq::INTEGER AS anon_4, :p_agent::VARCHAR AS anon_5, :p_rec_agent_type::VARCHAR AS anon_6,
  :p_rec_iteration::INTEGER AS anon_7, :p_rec_phase::VARCHAR AS anon_8, :p_rec_parent_id::VARCHAR AS anon_9,
  :p_rec_data::JSONB AS anon_10, :p_rec_snapshot::BYTEA AS anon_11, :p_rec_snapshot_encoding::VARCHAR AS anon_12,
  :p_rec_hash::VARCHAR AS anon_13, :p_rec_signature::VARCHAR AS anon_14, :p_rec_key_id::VARCHAR AS anon_15,
  :p_rec_retention::VARCHAR AS anon_16, :p_now::FLOAT AS anon_17
WHERE :p_history::BOOLEAN;

-- Inserts a history record of the task's checkpoint or end.
INSERT INTO agent_checkpoints (
               tenant_id, checkpoint_id, logical_task_id, seq, agent_name, agent_type, iteration,
               phase, parent_id, data, snapshot, snapshot_encoding, hash, signature, key_id,
               retention_policy, created_at)
SELECT :p_tenant AS anon_1, :p_rec_id AS anon_2, :p_task AS anon_3, :p_rec_seq AS anon_4,
  :p_agent AS anon_5, :p_rec_agent_type AS anon_6, :p_rec_iteration AS anon_7, :p_rec_phase AS anon_8,
  :p_rec_parent_id AS anon_9, :p_rec_data AS anon_10, :p_rec_snapshot AS anon_11, :p_rec_snapshot_encoding AS anon_12,
  :p_rec_hash AS anon_13, :p_rec_signature AS anon_14, :p_rec_key_id AS anon_15, :p_rec_retention AS anon_16,
  :p_now AS anon_17
WHERE :p_history = 1;

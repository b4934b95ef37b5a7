-- Inserts a task's history head with its first record.
INSERT INTO agent_checkpoint_heads (
               tenant_id, logical_task_id, agent_name, records, head_id, head_hash, signature,
               key_id, outcome, retention_policy, updated_at)
SELECT :p_tenant::VARCHAR AS anon_1, :p_task::VARCHAR AS anon_2, :p_agent::VARCHAR AS anon_3,
  :p_rec_seq::INTEGER AS anon_4, :p_rec_id::VARCHAR AS anon_5, :p_rec_hash::VARCHAR AS anon_6,
  :p_rec_head_signature::VARCHAR AS anon_7, :p_rec_head_key_id::VARCHAR AS anon_8, :p_rec_outcome::VARCHAR AS anon_9,
  :p_rec_retention::VARCHAR AS anon_10, :p_now::FLOAT AS anon_11
WHERE :p_history::BOOLEAN
  AND :p_rec_seq::INTEGER = 1;

-- Inserts a task's history head with its first record.
INSERT INTO agent_checkpoint_heads (
               tenant_id, logical_task_id, agent_name, records, head_id, head_hash, signature,
               key_id, outcome, retention_policy, updated_at)
SELECT :p_tenant AS anon_1, :p_task AS anon_2, :p_agent AS anon_3, :p_rec_seq AS anon_4,
  :p_rec_id AS anon_5, :p_rec_hash AS anon_6, :p_rec_head_signature AS anon_7, :p_rec_head_key_id AS anon_8,
  :p_rec_outcome AS anon_9, :p_rec_retention AS anon_10, :p_now AS anon_11
WHERE :p_history = 1
  AND :p_rec_seq = 1;

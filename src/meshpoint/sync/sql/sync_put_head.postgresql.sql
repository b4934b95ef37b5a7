-- Inserts a task's history head, or moves the cloud's to this one if it names a longer chain.
INSERT INTO agent_checkpoint_heads (
               tenant_id, logical_task_id, agent_name, records, head_id, head_hash, signature,
               key_id, pruned_through, pruned_hash, outcome, retention_policy, updated_at)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_agent_name::VARCHAR, :p_records::INTEGER, :p_head_id::VARCHAR, :p_head_hash::VARCHAR, :p_signature::VARCHAR, :p_key_id::VARCHAR, :p_pruned_through::INTEGER, :p_pruned_hash::VARCHAR, :p_outcome::VARCHAR, :p_retention_policy::VARCHAR, :p_updated_at::FLOAT) ON CONFLICT (tenant_id, logical_task_id) DO
UPDATE
SET agent_name = excluded.agent_name, records = excluded.records, head_id = excluded.head_id,
  head_hash = excluded.head_hash, signature = excluded.signature, key_id = excluded.key_id,
  pruned_through = excluded.pruned_through, pruned_hash = excluded.pruned_hash, outcome = excluded.outcome,
  retention_policy = excluded.retention_policy, updated_at = excluded.updated_at
WHERE agent_checkpoint_heads.records < excluded.records;

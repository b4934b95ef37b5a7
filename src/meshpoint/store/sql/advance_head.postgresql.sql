-- Moves a task's history head to its new record if the head is the record's parent (a compare-and-set on the previous hash and where the chain starts).
UPDATE agent_checkpoint_heads
SET agent_name=:p_agent::VARCHAR, records=:p_rec_seq::INTEGER, head_id=:p_rec_id::VARCHAR,
  head_hash=:p_rec_hash::VARCHAR, signature=:p_rec_head_signature::VARCHAR, key_id=:p_rec_head_key_id::VARCHAR,
  outcome=:p_rec_outcome::VARCHAR, retention_policy=:p_rec_retention::VARCHAR, updated_at=:p_now::FLOAT
WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR
  AND :p_history::BOOLEAN
  AND :p_rec_seq::INTEGER > 1
  AND agent_checkpoint_heads.records = :p_rec_seq::INTEGER - 1
  AND agent_checkpoint_heads.head_hash = :p_rec_parent_hash::VARCHAR
  AND agent_checkpoint_heads.pruned_through = :p_rec_pruned_through::INTEGER
  AND agent_checkpoint_heads.pruned_hash = :p_rec_pruned_hash::VARCHAR;

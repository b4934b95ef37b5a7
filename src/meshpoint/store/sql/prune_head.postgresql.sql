-- Moves where a task's chain starts after a purge, re-signed, if the head is still as the purge read it.
UPDATE agent_checkpoint_heads
SET signature=:p_head_signature::VARCHAR, key_id=:p_head_key_id::VARCHAR,
  pruned_through=:p_through::INTEGER, pruned_hash=:p_pruned_hash::VARCHAR, updated_at=:p_now::FLOAT
WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR
  AND agent_checkpoint_heads.records = :p_records::INTEGER
  AND agent_checkpoint_heads.pruned_through = :p_old_through::INTEGER;

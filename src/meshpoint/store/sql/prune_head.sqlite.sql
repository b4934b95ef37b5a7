-- Moves where a task's chain starts after a purge, re-signed, if the head is still as the purge read it.
UPDATE agent_checkpoint_heads
SET signature=:p_head_signature, key_id=:p_head_key_id, pruned_through=:p_through,
  pruned_hash=:p_pruned_hash, updated_at=:p_now
WHERE agent_checkpoint_heads.tenant_id = :p_tenant
  AND agent_checkpoint_heads.logical_task_id = :p_task
  AND agent_checkpoint_heads.records = :p_records
  AND agent_checkpoint_heads.pruned_through = :p_old_through;

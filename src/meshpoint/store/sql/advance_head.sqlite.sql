-- Moves a task's history head to its new record if the head is the record's parent (a compare-and-set on the previous hash and where the chain starts).
UPDATE agent_checkpoint_heads
SET agent_name=:p_agent, records=:p_rec_seq, head_id=:p_rec_id, head_hash=:p_rec_hash,
  signature=:p_rec_head_signature, key_id=:p_rec_head_key_id, outcome=:p_rec_outcome, retention_policy=:p_rec_retention,
  updated_at=:p_now
WHERE agent_checkpoint_heads.tenant_id = :p_tenant
  AND agent_checkpoint_heads.logical_task_id = :p_task
  AND :p_history = 1
  AND :p_rec_seq > 1
  AND agent_checkpoint_heads.records = :p_rec_seq - 1
  AND agent_checkpoint_heads.head_hash = :p_rec_parent_hash
  AND agent_checkpoint_heads.pruned_through = :p_rec_pruned_through
  AND agent_checkpoint_heads.pruned_hash = :p_rec_pruned_hash;

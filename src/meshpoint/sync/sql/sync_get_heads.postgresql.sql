-- Reads the cloud's history heads of a batch's tasks.
SELECT agent_checkpoint_heads.tenant_id, agent_checkpoint_heads.logical_task_id,
  agent_checkpoint_heads.agent_name, agent_checkpoint_heads.records, agent_checkpoint_heads.head_id,
  agent_checkpoint_heads.head_hash, agent_checkpoint_heads.signature, agent_checkpoint_heads.key_id,
  agent_checkpoint_heads.pruned_through, agent_checkpoint_heads.pruned_hash, agent_checkpoint_heads.outcome,
  agent_checkpoint_heads.retention_policy, agent_checkpoint_heads.updated_at
FROM agent_checkpoint_heads
WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoint_heads.logical_task_id = any(:p_tasks::VARCHAR[]);

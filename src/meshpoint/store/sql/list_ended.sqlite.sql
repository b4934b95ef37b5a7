-- Lists the tenant's ended tasks (a head with an outcome), of agent p_agent unless p_any_agent, the latest ended first.
SELECT agent_checkpoint_heads.tenant_id, agent_checkpoint_heads.logical_task_id,
  agent_checkpoint_heads.agent_name, agent_checkpoint_heads.records, agent_checkpoint_heads.head_id,
  agent_checkpoint_heads.head_hash, agent_checkpoint_heads.signature, agent_checkpoint_heads.key_id,
  agent_checkpoint_heads.pruned_through, agent_checkpoint_heads.pruned_hash, agent_checkpoint_heads.outcome,
  agent_checkpoint_heads.retention_policy, agent_checkpoint_heads.updated_at
FROM agent_checkpoint_heads
WHERE agent_checkpoint_heads.tenant_id = :p_tenant
  AND agent_checkpoint_heads.outcome IS NOT NULL
  AND (:p_any_agent = 1
       OR agent_checkpoint_heads.agent_name = :p_agent)
ORDER BY agent_checkpoint_heads.updated_at DESC, agent_checkpoint_heads.logical_task_id
LIMIT :p_limit
OFFSET 0;

-- Reads an agent's history records written in a time range, oldest first.
SELECT agent_checkpoints.tenant_id, agent_checkpoints.checkpoint_id,
  agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.data, agent_checkpoints.hash,
  agent_checkpoints.signature, agent_checkpoints.key_id
FROM agent_checkpoints
WHERE agent_checkpoints.agent_name = :p_agent
  AND agent_checkpoints.tenant_id = :p_tenant
  AND agent_checkpoints.created_at >= :p_since
  AND agent_checkpoints.created_at < :p_until
ORDER BY agent_checkpoints.created_at, agent_checkpoints.checkpoint_id
LIMIT :p_limit
OFFSET 0;

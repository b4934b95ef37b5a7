-- Reads the position, time and hash of each record of a task's chain.
SELECT agent_checkpoints.seq, agent_checkpoints.created_at, agent_checkpoints.hash
FROM agent_checkpoints
WHERE agent_checkpoints.logical_task_id = :p_task
  AND agent_checkpoints.tenant_id = :p_tenant
ORDER BY agent_checkpoints.seq;

-- Reads the id, place, hash and signature of the cloud's records of a batch's tasks.
SELECT agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.checkpoint_id,
  agent_checkpoints.hash, agent_checkpoints.signature, agent_checkpoints.key_id
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoints.logical_task_id = any(:p_tasks::VARCHAR[]);

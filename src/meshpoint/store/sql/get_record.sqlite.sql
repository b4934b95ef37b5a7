-- Reads one history record by its checkpoint id.
SELECT agent_checkpoints.tenant_id, agent_checkpoints.checkpoint_id,
  agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.data, agent_checkpoints.hash,
  agent_checkpoints.signature, agent_checkpoints.key_id
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant
  AND agent_checkpoints.checkpoint_id = :p_rec_id;

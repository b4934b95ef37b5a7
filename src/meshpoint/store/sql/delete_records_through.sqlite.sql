-- Deletes a task's records up to and including p_through (a purge: the oldest records).
DELETE
FROM agent_checkpoints
WHERE agent_checkpoints.logical_task_id = :p_task
  AND agent_checkpoints.tenant_id = :p_tenant
  AND agent_checkpoints.seq <= :p_through;

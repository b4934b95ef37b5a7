-- Deletes a task's head once a purge removed its every record, if it is still as the purge read it.
DELETE
FROM agent_checkpoint_heads
WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR
  AND agent_checkpoint_heads.records = :p_records::INTEGER;

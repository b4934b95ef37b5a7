-- Extends a resume lease its holder still holds.
UPDATE agent_paused_tasks
SET lease_expires_at=:p_lease_until::FLOAT, version=(agent_paused_tasks.version + 1)
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_paused_tasks.owner = :p_owner::VARCHAR RETURNING agent_paused_tasks.version;

-- Marks a task blocked for an operator and releases its lease, for the holder of the lease.
UPDATE agent_paused_tasks
SET status='blocked', owner=:owner::VARCHAR, lease_expires_at=:lease_expires_at::FLOAT, version=(agent_paused_tasks.version + 1)
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_paused_tasks.owner = :p_owner::VARCHAR;

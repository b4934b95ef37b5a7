-- Marks a task whose join completed as resuming, leasing it to the resolver if the lease is free.
UPDATE agent_paused_tasks
SET status='resuming', owner=
  CASE
      WHEN (agent_paused_tasks.owner IS NULL
            OR agent_paused_tasks.lease_expires_at <= :p_now) THEN :p_owner ELSE agent_paused_tasks.owner
  END, lease_expires_at=
  CASE
      WHEN (agent_paused_tasks.owner IS NULL
            OR agent_paused_tasks.lease_expires_at <= :p_now) THEN :p_lease_until ELSE agent_paused_tasks.lease_expires_at
  END, version=(agent_paused_tasks.version + 1)
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task RETURNING owner;

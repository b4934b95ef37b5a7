-- Takes the lease of a blocked or resumable task for an operator's resume if it is free or expired, and clears its count of take-overs.
UPDATE agent_paused_tasks
SET status='resuming', owner=:p_owner, lease_expires_at=:p_lease_until, version=(agent_paused_tasks.version + 1), recoveries=0
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task
  AND ((agent_paused_tasks.status || '') = 'resuming'
       OR (agent_paused_tasks.status || '') = 'working'
       OR (agent_paused_tasks.status || '') = 'blocked')
  AND (agent_paused_tasks.owner IS NULL
       OR agent_paused_tasks.lease_expires_at <= :p_now) RETURNING version, agent_name;

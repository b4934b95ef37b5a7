-- Takes a task's resume lease if its status is one of the given ones, the lease is free, expired or already the caller's, and the task is agent p_agent's (unless p_any_agent).
UPDATE agent_paused_tasks
SET status='resuming', owner=:p_owner, lease_expires_at=:p_lease_until, version=(agent_paused_tasks.version + 1)
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task
  AND (:p_any_agent = 1
       OR agent_paused_tasks.agent_name = :p_agent)
  AND (agent_paused_tasks.status || '') IN (:p_status_0, :p_status_1, :p_status_2,
                                              :p_status_3, :p_status_4, :p_status_5)
  AND (agent_paused_tasks.owner IS NULL
       OR agent_paused_tasks.lease_expires_at <= :p_now
       OR agent_paused_tasks.owner = :p_owner) RETURNING version;

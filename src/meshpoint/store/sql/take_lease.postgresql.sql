-- Takes a task's resume lease if its status is one of the given ones, the lease is free, expired or already the caller's, and the task is agent p_agent's (unless p_any_agent).
UPDATE agent_paused_tasks
SET status='resuming', owner=:p_owner::VARCHAR, lease_expires_at=:p_lease_until::FLOAT, version=(agent_paused_tasks.version + 1)
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND (:p_any_agent::BOOLEAN
       OR agent_paused_tasks.agent_name = :p_agent::VARCHAR)
  AND (agent_paused_tasks.status || '') IN (:p_status_0::VARCHAR, :p_status_1::VARCHAR,
                                              :p_status_2::VARCHAR, :p_status_3::VARCHAR, :p_status_4::VARCHAR,
                                              :p_status_5::VARCHAR)
  AND (agent_paused_tasks.owner IS NULL
       OR agent_paused_tasks.lease_expires_at <= :p_now::FLOAT
       OR agent_paused_tasks.owner = :p_owner::VARCHAR) RETURNING agent_paused_tasks.version;

-- Takes the lease of agent p_agent's resumable task if it is free or (unless p_only_free) expired, and counts a take-over when it was another holder's.
UPDATE agent_paused_tasks
SET status='resuming', owner=:p_owner::VARCHAR, lease_expires_at=:p_lease_until::FLOAT, version=(agent_paused_tasks.version + 1), recoveries=(agent_paused_tasks.recoveries + CASE
                                                                                                                                                                                  WHEN (agent_paused_tasks.owner IS NULL) THEN 0
                                                                                                                                                                                  ELSE 1
                                                                                                                                                                              END)
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_paused_tasks.agent_name = :p_agent::VARCHAR
  AND ((agent_paused_tasks.status || '') = 'resuming'
       OR (agent_paused_tasks.status || '') = 'working')
  AND (agent_paused_tasks.owner IS NULL
       OR NOT :p_only_free::BOOLEAN
       AND agent_paused_tasks.lease_expires_at <= :p_now::FLOAT) RETURNING agent_paused_tasks.version, agent_paused_tasks.recoveries;

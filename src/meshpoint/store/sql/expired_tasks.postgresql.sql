-- Lists an agent's tasks last checkpointed before a time that nobody holds a lease on, oldest first (for recovery to fail them).
SELECT agent_paused_tasks.logical_task_id
FROM agent_paused_tasks
WHERE agent_paused_tasks.agent_name = :p_agent::VARCHAR
  AND agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.checkpointed_at < :p_before::FLOAT
  AND (agent_paused_tasks.owner IS NULL
       OR agent_paused_tasks.lease_expires_at <= :p_now::FLOAT)
ORDER BY agent_paused_tasks.checkpointed_at
LIMIT :p_limit::INTEGER;

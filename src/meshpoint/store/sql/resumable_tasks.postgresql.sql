-- Lists an agent's tasks whose join completed, or that were checkpointed mid-turn, and that nobody is resuming (no lease, or an expired one).
SELECT agent_paused_tasks.logical_task_id
FROM agent_paused_tasks
WHERE agent_paused_tasks.agent_name = :p_agent::VARCHAR
  AND agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND status IN ('resuming', 'working')
  AND (agent_paused_tasks.owner IS NULL
       OR agent_paused_tasks.lease_expires_at <= :p_now::FLOAT)
ORDER BY agent_paused_tasks.lease_expires_at
LIMIT :p_limit::INTEGER;

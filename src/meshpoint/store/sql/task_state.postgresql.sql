-- Reads a task's status, lease, stored event count and agent (to explain a refusal).
SELECT agent_paused_tasks.status, agent_paused_tasks.owner, agent_paused_tasks.lease_expires_at,
  agent_paused_tasks.session_event_count, agent_paused_tasks.agent_name
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR;

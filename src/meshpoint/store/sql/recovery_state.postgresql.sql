-- Reads what a take-over of a task needs: its status, lease, agent, the state its live row holds and its take-overs in a row.
SELECT agent_paused_tasks.status, agent_paused_tasks.owner, agent_paused_tasks.lease_expires_at,
  agent_paused_tasks.agent_name, agent_paused_tasks.context_sha256, agent_paused_tasks.session_event_count,
  agent_paused_tasks.recoveries
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR;

-- Reads a task's conversation rows, in order.
SELECT agent_session_events.tenant_id, agent_session_events.logical_task_id,
  agent_session_events.seq, agent_session_events.data, agent_session_events.created_at
FROM agent_session_events
WHERE agent_session_events.tenant_id = :p_tenant::VARCHAR
  AND agent_session_events.logical_task_id = :p_task::VARCHAR
ORDER BY agent_session_events.seq;

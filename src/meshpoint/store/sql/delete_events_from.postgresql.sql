-- Deletes a task's conversation rows from event p_first on (a rewind to an earlier checkpoint).
DELETE
FROM agent_session_events
WHERE agent_session_events.tenant_id = :p_tenant::VARCHAR
  AND agent_session_events.logical_task_id = :p_task::VARCHAR
  AND agent_session_events.seq >= :p_first::INTEGER;

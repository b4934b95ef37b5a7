-- Deletes a task's conversation.
DELETE
FROM agent_session_events
WHERE agent_session_events.tenant_id = :p_tenant
  AND agent_session_events.logical_task_id = :p_task;

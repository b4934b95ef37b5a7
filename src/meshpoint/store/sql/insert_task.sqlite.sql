-- Inserts the task row of a first checkpoint (version 1, no lease).
INSERT INTO agent_paused_tasks (
               tenant_id, logical_task_id, agent_name, status, current_invocation_id, context,
               context_encoding, context_sha256, session_event_count, version, created_at, checkpointed_at,
               expires_at)
VALUES (:p_tenant, :p_task, :p_agent, :p_status, :p_invocation, :p_context, :p_encoding, :p_sha256, :p_event_count, 1, :p_now, :p_now, :p_expires_at);

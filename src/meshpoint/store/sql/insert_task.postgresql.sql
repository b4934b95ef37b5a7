-- Inserts the task row of a first checkpoint (version 1, no lease).
INSERT INTO agent_paused_tasks (
               tenant_id, logical_task_id, agent_name, status, current_invocation_id, context,
               context_encoding, context_sha256, session_event_count, version, created_at, checkpointed_at,
               expires_at)
VALUES (:p_tenant::VARCHAR, :p_task::VARCHAR, :p_agent::VARCHAR, :p_status::VARCHAR, :p_invocation::VARCHAR, :p_context::BYTEA, :p_encoding::VARCHAR, :p_sha256::VARCHAR, :p_event_count::INTEGER, 1, :p_now::FLOAT, :p_now::FLOAT, :p_expires_at::FLOAT);

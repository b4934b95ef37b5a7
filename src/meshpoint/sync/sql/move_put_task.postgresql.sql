-- Inserts a moved task's row of agent_paused_tasks.
INSERT INTO agent_paused_tasks (
               tenant_id, logical_task_id, agent_name, status, current_invocation_id, context,
               context_encoding, context_sha256, session_event_count, owner, lease_expires_at, version, created_at,
               checkpointed_at, expires_at, recoveries)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_agent_name::VARCHAR, :p_status::VARCHAR, :p_current_invocation_id::VARCHAR, :p_context::BYTEA, :p_context_encoding::VARCHAR, :p_context_sha256::VARCHAR, :p_session_event_count::INTEGER, :p_owner::VARCHAR, :p_lease_expires_at::FLOAT, :p_version::INTEGER, :p_created_at::FLOAT, :p_checkpointed_at::FLOAT, :p_expires_at::FLOAT, :p_recoveries::INTEGER);

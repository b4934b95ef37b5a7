-- Inserts a moved task's row of agent_peer_sub_tasks.
INSERT INTO agent_peer_sub_tasks (
               tenant_id, sub_task_id, logical_task_id, agent_name, invocation_id,
               function_call_id, peer_agent_name, peer_task_id, correlation_data, timeout_s, timeout_deadline,
               status, resolved_by, result, resolved_at, created_at)
VALUES (:p_tenant::VARCHAR, :p_sub_task_id::VARCHAR, :p_logical_task_id::VARCHAR, :p_agent_name::VARCHAR, :p_invocation_id::VARCHAR, :p_function_call_id::VARCHAR, :p_peer_agent_name::VARCHAR, :p_peer_task_id::VARCHAR, :p_correlation_data::JSON, :p_timeout_s::FLOAT, :p_timeout_deadline::FLOAT, :p_status::VARCHAR, :p_resolved_by::VARCHAR, :p_result::JSON, :p_resolved_at::FLOAT, :p_created_at::FLOAT);

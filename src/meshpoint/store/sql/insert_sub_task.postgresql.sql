-- Inserts one pending peer sub-task of a checkpoint (one parameter set per sub-task).
INSERT INTO agent_peer_sub_tasks (
               tenant_id, sub_task_id, logical_task_id, agent_name, invocation_id,
               function_call_id, peer_agent_name, peer_task_id, correlation_data, timeout_s, timeout_deadline,
               status, created_at)
VALUES (:p_tenant::VARCHAR, :sub_task_id::VARCHAR, :p_task::VARCHAR, :p_agent::VARCHAR, :invocation_id::VARCHAR, :function_call_id::VARCHAR, :peer_agent_name::VARCHAR, :peer_task_id::VARCHAR, :correlation_data::JSON, :timeout_s::FLOAT, :timeout_deadline::FLOAT, 'pending', :p_now::FLOAT);

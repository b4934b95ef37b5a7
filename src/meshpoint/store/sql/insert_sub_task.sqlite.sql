-- Inserts one pending peer sub-task of a checkpoint (one parameter set per sub-task).
INSERT INTO agent_peer_sub_tasks (
               tenant_id, sub_task_id, logical_task_id, agent_name, invocation_id,
               function_call_id, peer_agent_name, peer_task_id, correlation_data, timeout_s, timeout_deadline,
               status, created_at)
VALUES (:p_tenant, :sub_task_id, :p_task, :p_agent, :invocation_id, :function_call_id, :peer_agent_name, :peer_task_id, :correlation_data, :timeout_s, :timeout_deadline, 'pending', :p_now);

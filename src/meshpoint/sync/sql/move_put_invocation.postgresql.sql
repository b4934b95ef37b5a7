-- Inserts a moved task's row of agent_parallel_invocations.
INSERT INTO agent_parallel_invocations (
               tenant_id, logical_task_id, invocation_id, total_expected, completed_count,
               call_order, results, created_at)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_invocation_id::VARCHAR, :p_total_expected::INTEGER, :p_completed_count::INTEGER, :p_call_order::JSON, :p_results::JSON, :p_created_at::FLOAT);

-- Inserts one parallel invocation of a checkpoint with the results known at checkpoint time (one parameter set per invocation).
INSERT INTO agent_parallel_invocations (
               tenant_id, logical_task_id, invocation_id, total_expected, completed_count,
               call_order, results, created_at)
VALUES (:p_tenant::VARCHAR, :p_task::VARCHAR, :invocation_id::VARCHAR, :total_expected::INTEGER, :completed_count::INTEGER, :call_order::JSON, :results::JSON, :p_now::FLOAT);

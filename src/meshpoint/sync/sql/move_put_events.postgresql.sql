-- Inserts a moved task's row of agent_session_events.
INSERT INTO agent_session_events (
               tenant_id, logical_task_id, seq, data, created_at)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_seq::INTEGER, :p_data::JSON, :p_created_at::FLOAT);

-- Inserts an event (a taken id fails the statement: the batch is then compared with the cloud's rows, inserted unless taken and read back).
INSERT INTO agent_events (
               tenant_id, event_id, agent_name, logical_task_id, event_type, step_name,
               input_data, output_data, state_snapshot, created_at_us)
VALUES (:p_tenant::VARCHAR, :p_event_id::VARCHAR, :p_agent_name::VARCHAR, :p_logical_task_id::VARCHAR, :p_event_type::VARCHAR, :p_step_name::VARCHAR, :p_input_data::JSONB, :p_output_data::JSONB, :p_state_snapshot::JSONB, :p_created_at_us::BIGINT);

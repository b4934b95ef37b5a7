-- Appends one event to the event log (one parameter set per event); an event already written (a write retried after its commit) is left as it is.
INSERT INTO agent_events (
               tenant_id, event_id, agent_name, logical_task_id, event_type, step_name,
               input_data, output_data, state_snapshot, created_at_us)
VALUES (:p_tenant::VARCHAR, :p_event_id::VARCHAR, :p_agent::VARCHAR, :p_task::VARCHAR, :p_event_type::VARCHAR, :p_step::VARCHAR, :p_input::JSONB, :p_output::JSONB, :p_state::JSONB, :p_at_us::BIGINT) ON CONFLICT DO NOTHING;

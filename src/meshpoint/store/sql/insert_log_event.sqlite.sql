-- Appends one event to the event log (one parameter set per event); an event already written (a write retried after its commit) is left as it is.
INSERT INTO agent_events (
               tenant_id, event_id, agent_name, logical_task_id, event_type, step_name,
               input_data, output_data, state_snapshot, created_at_us)
VALUES (:p_tenant, :p_event_id, :p_agent, :p_task, :p_event_type, :p_step, :p_input, :p_output, :p_state, :p_at_us) ON CONFLICT DO NOTHING;

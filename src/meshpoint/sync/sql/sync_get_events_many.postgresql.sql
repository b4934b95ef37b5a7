-- Reads the cloud's events of a batch of ids.
SELECT agent_events.tenant_id, agent_events.event_id, agent_events.agent_name,
  agent_events.logical_task_id, agent_events.event_type, agent_events.step_name, agent_events.input_data,
  agent_events.output_data, agent_events.state_snapshot, agent_events.created_at_us
FROM agent_events
WHERE agent_events.tenant_id = :p_tenant::VARCHAR
  AND agent_events.event_id = any(:p_ids::VARCHAR[]);

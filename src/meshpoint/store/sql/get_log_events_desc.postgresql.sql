-- Reads the events matching the filters given, newest first (by time, then id), after the cursor's event (older than it) if one is given.
SELECT agent_events.event_id, agent_events.agent_name, agent_events.logical_task_id,
  agent_events.event_type, agent_events.step_name, agent_events.input_data, agent_events.output_data,
  agent_events.state_snapshot, agent_events.created_at_us
FROM agent_events
WHERE agent_events.tenant_id = :p_tenant::VARCHAR
  AND (:p_any_task::BOOLEAN
       OR agent_events.logical_task_id = :p_task::VARCHAR)
  AND (:p_any_agent::BOOLEAN
       OR agent_events.agent_name = :p_agent::VARCHAR)
  AND (:p_any_type::BOOLEAN
       OR agent_events.event_type = :p_event_type::VARCHAR)
  AND agent_events.created_at_us >= :p_since_us::BIGINT
  AND agent_events.created_at_us < :p_until_us::BIGINT
  AND (:p_no_cursor::BOOLEAN
       OR agent_events.created_at_us < :p_after_us::BIGINT
       OR agent_events.created_at_us = :p_after_us::BIGINT
       AND agent_events.event_id < :p_after_id::VARCHAR)
ORDER BY agent_events.created_at_us DESC, agent_events.event_id DESC
LIMIT :p_limit::INTEGER;

-- Reads the next rows of agent_events after a position, in commit order (rowid).
SELECT rowid AS sync_rowid, agent_events.tenant_id, agent_events.event_id,
  agent_events.agent_name, agent_events.logical_task_id, agent_events.event_type, agent_events.step_name,
  agent_events.input_data, agent_events.output_data, agent_events.state_snapshot, agent_events.created_at_us
FROM agent_events
WHERE agent_events.tenant_id = :p_tenant
  AND rowid > :p_after
ORDER BY rowid
LIMIT :p_limit
OFFSET 0;

-- Reads the key of the row of agent_events at a position.
SELECT agent_events.event_id
FROM agent_events
WHERE agent_events.tenant_id = :p_tenant
  AND rowid = :p_after;

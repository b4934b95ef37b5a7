-- Counts the rows of agent_events after a position.
SELECT count(*) AS count_1
FROM agent_events
WHERE agent_events.tenant_id = :p_tenant
  AND rowid > :p_after;

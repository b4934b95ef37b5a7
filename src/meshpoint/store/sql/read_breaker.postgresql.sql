-- Reads agent p_agent's breaker.
SELECT agent_breakers.state, agent_breakers.failures, agent_breakers.window_started_at,
  agent_breakers.opened_until, agent_breakers.trial_owner, agent_breakers.trial_until
FROM agent_breakers
WHERE agent_breakers.tenant_id = :p_tenant::VARCHAR
  AND agent_breakers.agent_name = :p_agent::VARCHAR;

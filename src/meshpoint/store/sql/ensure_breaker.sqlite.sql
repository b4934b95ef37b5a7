-- Writes agent p_agent's breaker, closed, unless it has one.
INSERT INTO agent_breakers (
               tenant_id, agent_name, state, failures, updated_at)
VALUES (:p_tenant, :p_agent, 'closed', 0, :p_now) ON CONFLICT DO NOTHING;

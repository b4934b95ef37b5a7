-- Writes agent p_agent's breaker, closed, unless it has one.
INSERT INTO agent_breakers (
               tenant_id, agent_name, state, failures, updated_at)
VALUES (:p_tenant::VARCHAR, :p_agent::VARCHAR, 'closed', 0, :p_now::FLOAT) ON CONFLICT DO NOTHING;

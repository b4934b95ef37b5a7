-- Writes agent p_agent's breaker's new state.
UPDATE agent_breakers
SET state=:p_state::VARCHAR, failures=:p_failures::INTEGER,
  window_started_at=:p_window_started_at::FLOAT, opened_until=:p_opened_until::FLOAT, trial_owner=:p_trial_owner::VARCHAR,
  trial_until=:p_trial_until::FLOAT, updated_at=:p_now::FLOAT
WHERE agent_breakers.tenant_id = :p_tenant::VARCHAR
  AND agent_breakers.agent_name = :p_agent::VARCHAR;

-- Writes agent p_agent's breaker's new state.
UPDATE agent_breakers
SET state=:p_state, failures=:p_failures, window_started_at=:p_window_started_at,
  opened_until=:p_opened_until, trial_owner=:p_trial_owner, trial_until=:p_trial_until, updated_at=:p_now
WHERE agent_breakers.tenant_id = :p_tenant
  AND agent_breakers.agent_name = :p_agent;

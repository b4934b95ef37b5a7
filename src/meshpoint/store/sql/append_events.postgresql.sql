-- Appends the conversation events of one checkpoint as one row, if it has any.
INSERT INTO agent_session_events (
               tenant_id, logical_task_id, seq, data, created_at)
SELECT :p_tenant::VARCHAR AS anon_1, :p_task::VARCHAR AS anon_2, :p_first::INTEGER AS anon_3,
  :p_events::JSON AS anon_4, :p_now::FLOAT AS anon_5
WHERE :p_has_events::BOOLEAN;

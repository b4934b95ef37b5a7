-- Appends the conversation events of one checkpoint as one row, if it has any.
INSERT INTO agent_session_events (
               tenant_id, logical_task_id, seq, data, created_at)
SELECT :p_tenant AS anon_1, :p_task AS anon_2, :p_first AS anon_3, :p_events AS anon_4,
  :p_now AS anon_5
WHERE :p_has_events = 1;

-- Inserts the task row of a first checkpoint (version 1, no lease), unless the task already ended.
INSERT INTO agent_paused_tasks (
               tenant_id, logical_task_id, agent_name, status, current_invocation_id, context,
               context_encoding, context_sha256, session_event_count, version, created_at, checkpointed_at,
               expires_at, owner, lease_expires_at)
SELECT :p_tenant::VARCHAR AS anon_1, :p_task::VARCHAR AS anon_2, :p_agent::VARCHAR AS anon_3,
  :p_status::VARCHAR AS anon_4, :p_invocation::VARCHAR AS anon_5, :p_context::BYTEA AS anon_6,
  :p_encoding::VARCHAR AS anon_7, :p_sha256::VARCHAR AS anon_8, :p_event_count::INTEGER AS anon_9, 1 AS anon_10,
  :p_now::FLOAT AS anon_11, :p_now::FLOAT AS anon__1, :p_expires_at::FLOAT AS anon_12, :p_holder::VARCHAR AS anon_13,
  :p_hold_until::FLOAT AS anon_14
WHERE NOT (EXISTS
             (SELECT 1 AS anon_15
              FROM agent_ended_tasks
              WHERE agent_ended_tasks.tenant_id = :p_tenant::VARCHAR
                AND agent_ended_tasks.logical_task_id = :p_task::VARCHAR));

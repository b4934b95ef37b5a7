-- Inserts the task row of a first checkpoint (version 1, no lease), unless the task already ended.
INSERT INTO agent_paused_tasks (
               tenant_id, logical_task_id, agent_name, status, current_invocation_id, context,
               context_encoding, context_sha256, session_event_count, version, created_at, checkpointed_at,
               expires_at, owner, lease_expires_at)
SELECT :p_tenant AS anon_1, :p_task AS anon_2, :p_agent AS anon_3, :p_status AS anon_4,
  :p_invocation AS anon_5, :p_context AS anon_6, :p_encoding AS anon_7, :p_sha256 AS anon_8, :p_event_count AS anon_9,
  1 AS anon_10, :p_now AS anon_11, :p_now AS anon__1, :p_expires_at AS anon_12, :p_holder AS anon_13,
  :p_hold_until AS anon_14
WHERE NOT (EXISTS
             (SELECT 1 AS anon_15
              FROM agent_ended_tasks
              WHERE agent_ended_tasks.tenant_id = :p_tenant
                AND agent_ended_tasks.logical_task_id = :p_task));

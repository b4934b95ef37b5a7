-- pg_recheckpoint without the history record.
WITH
  rewritten AS
  (UPDATE agent_paused_tasks
   SET status=:p_status::VARCHAR, current_invocation_id=:p_invocation::VARCHAR,
     context=:p_context::BYTEA, context_encoding=:p_encoding::VARCHAR, context_sha256=:p_sha256::VARCHAR,
     session_event_count=:p_event_count::INTEGER, owner=:p_holder::VARCHAR, lease_expires_at=:p_hold_until::FLOAT, version=(agent_paused_tasks.version + 1), checkpointed_at=:p_now::FLOAT, expires_at=:p_expires_at::FLOAT, recoveries=CASE
                                                                                                                                                                                                                                            WHEN (:p_status::VARCHAR = 'working'
                                                                                                                                                                                                                                                  AND :p_event_count::INTEGER <= agent_paused_tasks.session_event_count) THEN agent_paused_tasks.recoveries
                                                                                                                                                                                                                                            ELSE 0
                                                                                                                                                                                                                                        END
   WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
     AND agent_paused_tasks.owner = :p_owner::VARCHAR
     AND agent_paused_tasks.session_event_count = :p_first::INTEGER
     AND agent_paused_tasks.agent_name = :p_agent::VARCHAR
     AND NOT (EXISTS
                (SELECT 1 AS anon_1
                 FROM agent_peer_sub_tasks
                 WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
                   AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
                   AND agent_peer_sub_tasks.status != 'resolved')) RETURNING agent_paused_tasks.version),
  old_sub_tasks AS
  (DELETE
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
     AND (EXISTS
            (SELECT rewritten.version
             FROM rewritten)) RETURNING agent_peer_sub_tasks.sub_task_id),
  old_invocations AS
  (DELETE
   FROM agent_parallel_invocations
   WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
     AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR
     AND (EXISTS
            (SELECT rewritten.version
             FROM rewritten)) RETURNING agent_parallel_invocations.invocation_id),
  new_sub_tasks AS
  (INSERT INTO agent_peer_sub_tasks (
                  tenant_id, logical_task_id, agent_name, sub_task_id, invocation_id,
                  function_call_id, peer_agent_name, peer_task_id, correlation_data, timeout_s, timeout_deadline,
                  status, created_at) SELECT :p_tenant::VARCHAR AS anon_2, :p_task::VARCHAR AS anon_3, :p_agent::VARCHAR AS anon_4,
     subs.sub_task_id AS sub_task_id, subs.invocation_id AS invocation_id, subs.function_call_id AS function_call_id,
     subs.peer_agent_name AS peer_agent_name, subs.peer_task_id AS peer_task_id,
     CAST(subs.correlation_data AS JSON) AS correlation_data, subs.timeout_s AS timeout_s, subs.timeout_deadline AS timeout_deadline,
     'pending' AS anon_5, :p_now::FLOAT AS anon_6
   FROM json_to_recordset(:p_subs::JSON) AS subs(sub_task_id VARCHAR, invocation_id VARCHAR, function_call_id VARCHAR, peer_agent_name VARCHAR, peer_task_id VARCHAR, correlation_data TEXT, timeout_s FLOAT, timeout_deadline FLOAT)
   WHERE (EXISTS
            (SELECT rewritten.version
             FROM rewritten))
     AND
       (SELECT count(*) AS count_1
        FROM old_sub_tasks) +
       (SELECT count(*) AS count_2
        FROM old_invocations) >= 0),
  new_invocations AS
  (INSERT INTO agent_parallel_invocations (
                  tenant_id, logical_task_id, invocation_id, total_expected, completed_count,
                  call_order, results, created_at) SELECT :p_tenant::VARCHAR AS anon_2, :p_task::VARCHAR AS anon_3,
     invs.invocation_id AS invocation_id, invs.total_expected AS total_expected, invs.completed_count AS completed_count,
     CAST(invs.call_order AS JSON) AS call_order, CAST(invs.results AS JSON) AS results, :p_now::FLOAT AS anon_6
   FROM json_to_recordset(:p_invs::JSON) AS invs(invocation_id VARCHAR, total_expected INTEGER, completed_count INTEGER, call_order TEXT, results TEXT)
   WHERE (EXISTS
            (SELECT rewritten.version
             FROM rewritten))
     AND
       (SELECT count(*) AS count_1
        FROM old_sub_tasks) +
       (SELECT count(*) AS count_2
        FROM old_invocations) >= 0),
  new_events AS
  (INSERT INTO agent_session_events (
                  tenant_id, logical_task_id, seq, data, created_at) SELECT :p_tenant::VARCHAR AS anon_2, :p_task::VARCHAR AS anon_3, :p_first::INTEGER AS anon_7,
     :p_events::JSON AS anon_8, :p_now::FLOAT AS anon_6
   WHERE :p_has_events::BOOLEAN
     AND (EXISTS
            (SELECT rewritten.version
             FROM rewritten))
     AND
       (SELECT count(*) AS count_1
        FROM old_sub_tasks) +
       (SELECT count(*) AS count_2
        FROM old_invocations) >= 0)
SELECT rewritten.version
FROM rewritten;

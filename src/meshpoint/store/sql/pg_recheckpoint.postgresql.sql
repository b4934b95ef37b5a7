-- Writes a re-checkpoint in one statement: recheckpoint_task (if no sub-task is open and the history's head is the new record's parent), the old children deleted, the new ones and the history record inserted.
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
                   AND agent_peer_sub_tasks.status != 'resolved'))
     AND (NOT :p_history::BOOLEAN
          OR :p_rec_seq::INTEGER = 1
          AND NOT (EXISTS
                     (SELECT agent_checkpoint_heads.records
                      FROM agent_checkpoint_heads
                      WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
                        AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR))
          OR (EXISTS
                (SELECT agent_checkpoint_heads.head_hash
                 FROM agent_checkpoint_heads
                 WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
                   AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR
                   AND agent_checkpoint_heads.records = :p_rec_seq::INTEGER - 1
                   AND agent_checkpoint_heads.head_hash = :p_rec_parent_hash::VARCHAR
                   AND agent_checkpoint_heads.pruned_through = :p_rec_pruned_through::INTEGER
                   AND agent_checkpoint_heads.pruned_hash = :p_rec_pruned_hash::VARCHAR))) RETURNING agent_paused_tasks.version),
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
        FROM old_invocations) >= 0),
  new_record AS
  (INSERT INTO agent_checkpoints (
                  tenant_id, checkpoint_id, logical_task_id, seq, agent_name, agent_type, iteration,
                  phase, parent_id, data, snapshot, snapshot_encoding, hash, signature, key_id,
                  retention_policy, created_at) SELECT :p_tenant::VARCHAR AS anon_2, :p_rec_id::VARCHAR AS anon_9, :p_task::VARCHAR AS anon_3,
     :p_rec_seq::INTEGER AS anon_10, :p_agent::VARCHAR AS anon_4, :p_rec_agent_type::VARCHAR AS anon_11,
     :p_rec_iteration::INTEGER AS anon_12, :p_rec_phase::VARCHAR AS anon_13, :p_rec_parent_id::VARCHAR AS anon_14,
     :p_rec_data::JSONB AS anon_15, :p_rec_snapshot::BYTEA AS anon_16, :p_rec_snapshot_encoding::VARCHAR AS anon_17,
     :p_rec_hash::VARCHAR AS anon_18, :p_rec_signature::VARCHAR AS anon_19, :p_rec_key_id::VARCHAR AS anon_20,
     :p_rec_retention::VARCHAR AS anon_21, :p_now::FLOAT AS anon_6
   WHERE :p_history::BOOLEAN
     AND (EXISTS
            (SELECT rewritten.version
             FROM rewritten))),
  new_head AS
  (INSERT INTO agent_checkpoint_heads (
                  tenant_id, logical_task_id, agent_name, records, head_id, head_hash, signature,
                  key_id, outcome, retention_policy, updated_at) SELECT :p_tenant::VARCHAR AS anon_2, :p_task::VARCHAR AS anon_3, :p_agent::VARCHAR AS anon_4,
     :p_rec_seq::INTEGER AS anon_10, :p_rec_id::VARCHAR AS anon_22, :p_rec_hash::VARCHAR AS anon_18,
     :p_rec_head_signature::VARCHAR AS anon_23, :p_rec_head_key_id::VARCHAR AS anon_24, :p_rec_outcome::VARCHAR AS anon_25,
     :p_rec_retention::VARCHAR AS anon_26, :p_now::FLOAT AS anon_6
   WHERE :p_history::BOOLEAN
     AND :p_rec_seq::INTEGER = 1
     AND (EXISTS
            (SELECT rewritten.version
             FROM rewritten))),
  moved_head AS
  (UPDATE agent_checkpoint_heads
   SET agent_name=:p_agent::VARCHAR, records=:p_rec_seq::INTEGER, head_id=:p_rec_id::VARCHAR,
     head_hash=:p_rec_hash::VARCHAR, signature=:p_rec_head_signature::VARCHAR, key_id=:p_rec_head_key_id::VARCHAR,
     outcome=:p_rec_outcome::VARCHAR, retention_policy=:p_rec_retention::VARCHAR, updated_at=:p_now::FLOAT
   WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
     AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR
     AND :p_history::BOOLEAN
     AND :p_rec_seq::INTEGER > 1
     AND agent_checkpoint_heads.records = :p_rec_seq::INTEGER - 1
     AND agent_checkpoint_heads.head_hash = :p_rec_parent_hash::VARCHAR
     AND agent_checkpoint_heads.pruned_through = :p_rec_pruned_through::INTEGER
     AND agent_checkpoint_heads.pruned_hash = :p_rec_pruned_hash::VARCHAR
     AND (EXISTS
            (SELECT rewritten.version
             FROM rewritten)) RETURNING agent_checkpoint_heads.records)
SELECT rewritten.version,
  1 / CAST(CAST(NOT (EXISTS
                       (SELECT rewritten.version
                        FROM rewritten))
                OR NOT :p_history::BOOLEAN
                OR :p_rec_seq::INTEGER = 1
                OR (EXISTS
                      (SELECT moved_head.records
                       FROM moved_head)) AS INTEGER) AS NUMERIC) AS head_moved_or_fail
FROM rewritten;

-- Ends a task in one statement for its lease holder: its sub-tasks, invocations and events deleted, then its row, its end recorded in the ledger and its last history record written.
WITH
  old_sub_tasks AS
  (DELETE
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR RETURNING agent_peer_sub_tasks.sub_task_id),
  old_invocations AS
  (DELETE
   FROM agent_parallel_invocations
   WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
     AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR RETURNING agent_parallel_invocations.invocation_id),
  old_events AS
  (DELETE
   FROM agent_session_events
   WHERE agent_session_events.tenant_id = :p_tenant::VARCHAR
     AND agent_session_events.logical_task_id = :p_task::VARCHAR RETURNING agent_session_events.seq),
  gone AS
  (DELETE
   FROM agent_paused_tasks
   WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
     AND agent_paused_tasks.owner = :p_owner::VARCHAR
     AND agent_paused_tasks.agent_name = :p_agent::VARCHAR
     AND
       (SELECT count(*) AS count_1
        FROM old_sub_tasks) +
       (SELECT count(*) AS count_2
        FROM old_invocations) +
       (SELECT count(*) AS count_3
        FROM old_events) >= 0 RETURNING agent_paused_tasks.agent_name),
  ended AS
  (INSERT INTO agent_ended_tasks (
                  tenant_id, logical_task_id, agent_name, ended_at) SELECT :p_tenant::VARCHAR AS anon_1, :p_task::VARCHAR AS anon_2, :p_agent::VARCHAR AS anon_3,
     :p_now::FLOAT AS anon_4
   WHERE NOT (EXISTS
                (SELECT 1 AS anon_5
                 FROM agent_ended_tasks
                 WHERE agent_ended_tasks.tenant_id = :p_tenant::VARCHAR
                   AND agent_ended_tasks.logical_task_id = :p_task::VARCHAR))
     AND (EXISTS
            (SELECT gone.agent_name
             FROM gone)) RETURNING agent_ended_tasks.logical_task_id),
  new_record AS
  (INSERT INTO agent_checkpoints (
                  tenant_id, checkpoint_id, logical_task_id, seq, agent_name, agent_type, iteration,
                  phase, parent_id, data, snapshot, snapshot_encoding, hash, signature, key_id,
                  retention_policy, created_at) SELECT :p_tenant::VARCHAR AS anon_1, :p_rec_id::VARCHAR AS anon_6, :p_task::VARCHAR AS anon_2,
     :p_rec_seq::INTEGER AS anon_7, :p_agent::VARCHAR AS anon_3, :p_rec_agent_type::VARCHAR AS anon_8,
     :p_rec_iteration::INTEGER AS anon_9, :p_rec_phase::VARCHAR AS anon_10, :p_rec_parent_id::VARCHAR AS anon_11,
     :p_rec_data::JSONB AS anon_12, :p_rec_snapshot::BYTEA AS anon_13, :p_rec_snapshot_encoding::VARCHAR AS anon_14,
     :p_rec_hash::VARCHAR AS anon_15, :p_rec_signature::VARCHAR AS anon_16, :p_rec_key_id::VARCHAR AS anon_17,
     :p_rec_retention::VARCHAR AS anon_18, :p_now::FLOAT AS anon_4
   WHERE :p_history::BOOLEAN
     AND (EXISTS
            (SELECT gone.agent_name
             FROM gone))),
  new_head AS
  (INSERT INTO agent_checkpoint_heads (
                  tenant_id, logical_task_id, agent_name, records, head_id, head_hash, signature,
                  key_id, outcome, retention_policy, updated_at) SELECT :p_tenant::VARCHAR AS anon_1, :p_task::VARCHAR AS anon_2, :p_agent::VARCHAR AS anon_3,
     :p_rec_seq::INTEGER AS anon_7, :p_rec_id::VARCHAR AS anon_19, :p_rec_hash::VARCHAR AS anon_15,
     :p_rec_head_signature::VARCHAR AS anon_20, :p_rec_head_key_id::VARCHAR AS anon_21, :p_rec_outcome::VARCHAR AS anon_22,
     :p_rec_retention::VARCHAR AS anon_23, :p_now::FLOAT AS anon_4
   WHERE :p_history::BOOLEAN
     AND :p_rec_seq::INTEGER = 1
     AND (EXISTS
            (SELECT gone.agent_name
             FROM gone))),
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
            (SELECT gone.agent_name
             FROM gone)) RETURNING agent_checkpoint_heads.records)
SELECT
  1 / CAST(CAST(EXISTS
                  (SELECT gone.agent_name
                   FROM gone) AS INTEGER) AS NUMERIC) AS deleted_or_fail,
  1 / CAST(CAST(NOT (EXISTS
                       (SELECT gone.agent_name
                        FROM gone))
                OR NOT :p_history::BOOLEAN
                OR :p_rec_seq::INTEGER = 1
                OR (EXISTS
                      (SELECT moved_head.records
                       FROM moved_head)) AS INTEGER) AS NUMERIC) AS head_moved_or_fail;

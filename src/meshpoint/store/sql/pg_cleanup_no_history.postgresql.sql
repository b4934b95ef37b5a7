-- pg_cleanup without the history record.
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
             FROM gone)) RETURNING agent_ended_tasks.logical_task_id)
SELECT 1 / CAST(CAST(EXISTS
                       (SELECT gone.agent_name
                        FROM gone) AS INTEGER) AS NUMERIC) AS deleted_or_fail;

-- pg_restore without the history's head and record.
SELECT agent_paused_tasks.tenant_id, agent_paused_tasks.logical_task_id,
  agent_paused_tasks.agent_name, agent_paused_tasks.status, agent_paused_tasks.current_invocation_id,
  agent_paused_tasks.context, agent_paused_tasks.context_encoding, agent_paused_tasks.context_sha256,
  agent_paused_tasks.session_event_count, agent_paused_tasks.owner, agent_paused_tasks.lease_expires_at, agent_paused_tasks.version,
  agent_paused_tasks.created_at, agent_paused_tasks.checkpointed_at, agent_paused_tasks.expires_at,

  (SELECT coalesce(

            json_agg(json_build_array(
                       agent_session_events.seq, agent_session_events.data)
                     ORDER BY agent_session_events.seq), '[]'::json) AS coalesce_1
   FROM agent_session_events
   WHERE agent_session_events.tenant_id = :p_tenant::VARCHAR
     AND agent_session_events.logical_task_id = :p_task::VARCHAR) AS event_rows,

  (SELECT coalesce(

            json_agg(json_build_array(
                       agent_parallel_invocations.invocation_id,
                       agent_parallel_invocations.call_order, agent_parallel_invocations.results)), '[]'::json) AS coalesce_2
   FROM agent_parallel_invocations
   WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
     AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR) AS invocation_rows,

  (SELECT coalesce(

            json_agg(json_build_array(
                       agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.logical_task_id,
                       agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id,
                       agent_peer_sub_tasks.function_call_id, agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id,
                       agent_peer_sub_tasks.correlation_data, agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.status,
                       agent_peer_sub_tasks.resolved_by, agent_peer_sub_tasks.result)
                     ORDER BY
      agent_peer_sub_tasks.created_at, agent_peer_sub_tasks.sub_task_id), '[]'::json) AS coalesce_3
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR) AS sub_task_rows
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR;

-- Reads a paused task's row, all its children and its history head with the record it names in one statement (get_task, get_events, get_invocations, get_task_sub_tasks, get_head and get_record_at).
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
     AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR) AS sub_task_rows,

  (SELECT json_build_array(
            agent_checkpoint_heads.tenant_id, agent_checkpoint_heads.logical_task_id,
            agent_checkpoint_heads.agent_name, agent_checkpoint_heads.records, agent_checkpoint_heads.head_id,
            agent_checkpoint_heads.head_hash, agent_checkpoint_heads.signature, agent_checkpoint_heads.key_id,
            agent_checkpoint_heads.pruned_through, agent_checkpoint_heads.pruned_hash, agent_checkpoint_heads.outcome,
            agent_checkpoint_heads.retention_policy, agent_checkpoint_heads.updated_at) AS json_build_array_1
   FROM agent_checkpoint_heads
   WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
     AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR) AS head_row,

  (SELECT json_build_array(
            agent_checkpoints.tenant_id, agent_checkpoints.checkpoint_id,
            agent_checkpoints.logical_task_id, agent_checkpoints.seq, agent_checkpoints.data, agent_checkpoints.hash,
            agent_checkpoints.signature, agent_checkpoints.key_id) AS json_build_array_2
   FROM agent_checkpoints
   WHERE agent_checkpoints.logical_task_id = :p_task::VARCHAR
     AND agent_checkpoints.tenant_id = :p_tenant::VARCHAR
     AND agent_checkpoints.seq =
       (SELECT agent_checkpoint_heads.records
        FROM agent_checkpoint_heads
        WHERE agent_checkpoint_heads.tenant_id = :p_tenant::VARCHAR
          AND agent_checkpoint_heads.logical_task_id = :p_task::VARCHAR)) AS latest_row
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR;

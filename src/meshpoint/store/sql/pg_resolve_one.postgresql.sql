-- Resolves one sub-task in one statement: resolve_pending, advance_invocation and, if that completes the join, mark_resuming.
WITH
  resolved AS
  (UPDATE agent_peer_sub_tasks
   SET status='resolved', resolved_by=:p_resolved_by::VARCHAR, result=:p_result::JSON, resolved_at=:p_now::FLOAT
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_peer_sub_tasks.sub_task_id = :p_sub::VARCHAR
     AND agent_peer_sub_tasks.status = 'pending'
     AND (:p_any_agent::BOOLEAN
          OR agent_peer_sub_tasks.agent_name = :p_agent::VARCHAR)
     AND json_typeof(agent_peer_sub_tasks.correlation_data) = 'object'
     AND
       (SELECT agent_parallel_invocations.completed_count < agent_parallel_invocations.total_expected AS anon_1
        FROM agent_parallel_invocations
        WHERE agent_parallel_invocations.tenant_id = agent_peer_sub_tasks.tenant_id
          AND agent_parallel_invocations.logical_task_id = agent_peer_sub_tasks.logical_task_id
          AND agent_parallel_invocations.invocation_id = agent_peer_sub_tasks.invocation_id) RETURNING agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.logical_task_id,
     agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id, agent_peer_sub_tasks.function_call_id,
     agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id, agent_peer_sub_tasks.correlation_data,
     agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.status, agent_peer_sub_tasks.resolved_by,
     agent_peer_sub_tasks.result),
  counted AS
  (UPDATE agent_parallel_invocations
   SET completed_count=(agent_parallel_invocations.completed_count + 1)
   WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
     AND agent_parallel_invocations.logical_task_id =
       (SELECT resolved.logical_task_id
        FROM resolved)
     AND agent_parallel_invocations.invocation_id =
       (SELECT resolved.invocation_id
        FROM resolved)
     AND agent_parallel_invocations.completed_count < agent_parallel_invocations.total_expected RETURNING agent_parallel_invocations.logical_task_id, agent_parallel_invocations.completed_count,
     agent_parallel_invocations.total_expected),
  resumed AS
  (UPDATE agent_paused_tasks
   SET status='resuming', owner=
     CASE
         WHEN (agent_paused_tasks.owner IS NULL
               OR agent_paused_tasks.lease_expires_at <= :p_now::FLOAT) THEN :p_owner::VARCHAR ELSE agent_paused_tasks.owner
     END, lease_expires_at=
     CASE
         WHEN (agent_paused_tasks.owner IS NULL
               OR agent_paused_tasks.lease_expires_at <= :p_now::FLOAT) THEN :p_lease_until::FLOAT ELSE agent_paused_tasks.lease_expires_at
     END, version=(agent_paused_tasks.version + 1)
   WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
     AND agent_paused_tasks.logical_task_id =
       (SELECT counted.logical_task_id
        FROM counted
        WHERE counted.completed_count = counted.total_expected) RETURNING agent_paused_tasks.owner)
SELECT resolved.sub_task_id, resolved.logical_task_id, resolved.agent_name,
  resolved.invocation_id, resolved.function_call_id, resolved.peer_agent_name, resolved.peer_task_id,
  resolved.correlation_data, resolved.timeout_deadline, resolved.status, resolved.resolved_by, resolved.result,
  counted.completed_count AS completed, counted.total_expected AS total, resumed.owner AS holder,
  1 / CAST(CAST(counted.completed_count IS NOT NULL AS INTEGER) AS NUMERIC) AS counted_or_fail
FROM resolved
LEFT OUTER JOIN counted ON true
LEFT OUTER JOIN resumed ON true;

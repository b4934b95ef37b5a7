-- Claims a pending sub-task without recording a result (the first of two steps).
UPDATE agent_peer_sub_tasks
SET timeout_deadline=
  CASE
      WHEN (agent_peer_sub_tasks.timeout_deadline < (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001) THEN agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s ELSE agent_peer_sub_tasks.timeout_deadline
  END, status='claimed', resolved_at=:p_now
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.sub_task_id = :p_sub
  AND agent_peer_sub_tasks.status = 'pending' RETURNING sub_task_id, logical_task_id, agent_name, invocation_id, function_call_id, peer_agent_name,
  peer_task_id, correlation_data, timeout_deadline, status, resolved_by, result;

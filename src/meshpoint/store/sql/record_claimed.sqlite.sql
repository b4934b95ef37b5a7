-- Records the result of a claimed call (the second step of the two: claim, then record).
UPDATE agent_peer_sub_tasks
SET status='resolved', resolved_by=:p_resolved_by, result=:p_result, resolved_at=:p_now
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.logical_task_id = :p_task
  AND agent_peer_sub_tasks.invocation_id = :p_invocation
  AND agent_peer_sub_tasks.function_call_id = :p_call
  AND agent_peer_sub_tasks.status = 'claimed' RETURNING sub_task_id, logical_task_id, agent_name, invocation_id, function_call_id, peer_agent_name,
  peer_task_id, correlation_data, timeout_deadline, status, resolved_by, result;

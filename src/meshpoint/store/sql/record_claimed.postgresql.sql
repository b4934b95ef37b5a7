-- Records the result of a claimed call (the second step of the two: claim, then record).
UPDATE agent_peer_sub_tasks
SET status='resolved', resolved_by=:p_resolved_by::VARCHAR, result=:p_result::JSON, resolved_at=:p_now::FLOAT
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_peer_sub_tasks.invocation_id = :p_invocation::VARCHAR
  AND agent_peer_sub_tasks.function_call_id = :p_call::VARCHAR
  AND agent_peer_sub_tasks.status = 'claimed' RETURNING agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.logical_task_id,
  agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id, agent_peer_sub_tasks.function_call_id,
  agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id, agent_peer_sub_tasks.correlation_data,
  agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.status, agent_peer_sub_tasks.resolved_by,
  agent_peer_sub_tasks.result;

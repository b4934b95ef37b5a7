-- Claims a pending sub-task (of agent p_agent's task, unless p_any_agent) and records its result: the exactly-once step, since only one transaction can move a row out of pending.
UPDATE agent_peer_sub_tasks
SET status='resolved', resolved_by=:p_resolved_by, result=:p_result, resolved_at=:p_now
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.sub_task_id = :p_sub
  AND agent_peer_sub_tasks.status = 'pending'
  AND (:p_any_agent = 1
       OR agent_peer_sub_tasks.agent_name = :p_agent) RETURNING sub_task_id, logical_task_id, agent_name, invocation_id, function_call_id, peer_agent_name,
  peer_task_id, correlation_data, timeout_deadline, status, resolved_by, result;

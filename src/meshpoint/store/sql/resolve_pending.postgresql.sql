-- Claims a pending sub-task (of agent p_agent's task, unless p_any_agent) and records its result: the exactly-once step, since only one transaction can move a row out of pending.
UPDATE agent_peer_sub_tasks
SET status='resolved', resolved_by=:p_resolved_by::VARCHAR, result=:p_result::JSON, resolved_at=:p_now::FLOAT
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.sub_task_id = :p_sub::VARCHAR
  AND agent_peer_sub_tasks.status = 'pending'
  AND (:p_any_agent::BOOLEAN
       OR agent_peer_sub_tasks.agent_name = :p_agent::VARCHAR) RETURNING agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.logical_task_id,
  agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id, agent_peer_sub_tasks.function_call_id,
  agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id, agent_peer_sub_tasks.correlation_data,
  agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.status, agent_peer_sub_tasks.resolved_by,
  agent_peer_sub_tasks.result;

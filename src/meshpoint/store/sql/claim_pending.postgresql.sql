-- Claims a pending sub-task without recording a result (the first of two steps).
UPDATE agent_peer_sub_tasks
SET timeout_deadline=
  CASE
      WHEN (agent_peer_sub_tasks.timeout_deadline < (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001) THEN agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s ELSE agent_peer_sub_tasks.timeout_deadline
  END, status='claimed', resolved_at=:p_now::FLOAT
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.sub_task_id = :p_sub::VARCHAR
  AND agent_peer_sub_tasks.status = 'pending' RETURNING agent_peer_sub_tasks.sub_task_id, agent_peer_sub_tasks.logical_task_id,
  agent_peer_sub_tasks.agent_name, agent_peer_sub_tasks.invocation_id, agent_peer_sub_tasks.function_call_id,
  agent_peer_sub_tasks.peer_agent_name, agent_peer_sub_tasks.peer_task_id, agent_peer_sub_tasks.correlation_data,
  agent_peer_sub_tasks.timeout_deadline, agent_peer_sub_tasks.status, agent_peer_sub_tasks.resolved_by,
  agent_peer_sub_tasks.result;

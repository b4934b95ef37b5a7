-- Restarts a pending sub-task's deadline (a status update from its peer) and records the peer's task id.
UPDATE agent_peer_sub_tasks
SET peer_task_id=coalesce(
                   :p_peer_task::VARCHAR, agent_peer_sub_tasks.peer_task_id),
  timeout_s=coalesce(
              :p_timeout::FLOAT, agent_peer_sub_tasks.timeout_s),
  timeout_deadline=(:p_now::FLOAT + coalesce(
                                      :p_timeout::FLOAT, agent_peer_sub_tasks.timeout_s))
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.sub_task_id = :p_sub::VARCHAR
  AND agent_peer_sub_tasks.status = 'pending' RETURNING agent_peer_sub_tasks.timeout_deadline;

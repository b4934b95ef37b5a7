-- Restarts a pending sub-task's deadline (a status update from its peer) and records the peer's task id.
UPDATE agent_peer_sub_tasks
SET peer_task_id=coalesce(
                   :p_peer_task, agent_peer_sub_tasks.peer_task_id),
  timeout_s=coalesce(:p_timeout, agent_peer_sub_tasks.timeout_s), timeout_deadline=(:p_now + coalesce(

                                                                                               :p_timeout,
                                                                                               agent_peer_sub_tasks.timeout_s))
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.sub_task_id = :p_sub
  AND agent_peer_sub_tasks.status = 'pending' RETURNING timeout_deadline;

-- Lists one page of paused tasks in id order after a given id, of an id range, optionally of one agent and one status, with each one's open sub-tasks.
SELECT agent_paused_tasks.logical_task_id, agent_paused_tasks.agent_name,
  agent_paused_tasks.status, agent_paused_tasks.owner, agent_paused_tasks.lease_expires_at, agent_paused_tasks.version,
  agent_paused_tasks.checkpointed_at,

  (SELECT count(*) AS count_1
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
     AND status IN ('pending', 'claimed')
     AND agent_peer_sub_tasks.logical_task_id = agent_paused_tasks.logical_task_id) AS anon_1
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id > :p_after
  AND agent_paused_tasks.logical_task_id >= :p_from
  AND agent_paused_tasks.logical_task_id < :p_to
  AND (:p_any_agent = 1
       OR agent_paused_tasks.agent_name = :p_agent)
  AND (:p_any_status = 1
       OR agent_paused_tasks.status = :p_status)
ORDER BY agent_paused_tasks.logical_task_id
LIMIT :p_limit
OFFSET 0;

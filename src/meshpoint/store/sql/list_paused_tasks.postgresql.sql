-- Lists paused tasks, oldest checkpoint first, with their open sub-tasks and next deadline (optionally of one agent, in one status).
SELECT agent_paused_tasks.logical_task_id, agent_paused_tasks.agent_name,
  agent_paused_tasks.status, agent_paused_tasks.owner, agent_paused_tasks.lease_expires_at, agent_paused_tasks.version,
  agent_paused_tasks.checkpointed_at, anon_1.n, anon_1.next_deadline
FROM agent_paused_tasks
LEFT OUTER JOIN
  (SELECT agent_peer_sub_tasks.logical_task_id AS logical_task_id, count(*) AS n,
     min(CASE
             WHEN (agent_peer_sub_tasks.timeout_deadline < (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001) THEN agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s ELSE agent_peer_sub_tasks.timeout_deadline
         END) AS next_deadline
   FROM agent_peer_sub_tasks
   WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
     AND status IN ('pending', 'claimed')
   GROUP BY agent_peer_sub_tasks.logical_task_id) AS anon_1 ON anon_1.logical_task_id = agent_paused_tasks.logical_task_id
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND (:p_any_agent::BOOLEAN
       OR agent_paused_tasks.agent_name = :p_agent::VARCHAR)
  AND (:p_any_status::BOOLEAN
       OR agent_paused_tasks.status = :p_status::VARCHAR)
ORDER BY agent_paused_tasks.checkpointed_at, agent_paused_tasks.logical_task_id
LIMIT :p_limit::INTEGER;

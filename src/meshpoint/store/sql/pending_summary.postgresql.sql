-- Counts open sub-tasks and reads the next deadline.
SELECT count(*) AS count_1,
  min(CASE
          WHEN (agent_peer_sub_tasks.timeout_deadline < (agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s) - 0.001) THEN agent_peer_sub_tasks.created_at + agent_peer_sub_tasks.timeout_s ELSE agent_peer_sub_tasks.timeout_deadline
      END) AS min_1
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND status IN ('pending', 'claimed');

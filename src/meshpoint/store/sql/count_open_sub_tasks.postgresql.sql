-- Counts a task's sub-tasks that can still be resolved.
SELECT count(*) AS count_1
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_peer_sub_tasks.status != 'resolved';

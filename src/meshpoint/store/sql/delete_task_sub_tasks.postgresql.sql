-- Deletes every sub-task of a task.
DELETE
FROM agent_peer_sub_tasks
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.logical_task_id = :p_task::VARCHAR;

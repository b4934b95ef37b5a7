-- Gives a task's sub-tasks taken out for a move back to local claims.
UPDATE agent_peer_sub_tasks
SET status='pending'
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.logical_task_id = :p_task
  AND agent_peer_sub_tasks.status = 'moving';

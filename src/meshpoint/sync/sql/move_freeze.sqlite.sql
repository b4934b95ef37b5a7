-- Takes a held task's pending sub-tasks out of every local claim.
UPDATE agent_peer_sub_tasks
SET status='moving'
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.logical_task_id = :p_task
  AND agent_peer_sub_tasks.status = 'pending';

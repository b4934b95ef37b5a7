-- Parks a sub-task of a task whose rows are corrupt.
UPDATE agent_peer_sub_tasks
SET status='quarantined', resolved_by=:resolved_by, result=:result, resolved_at=:p_now
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant
  AND agent_peer_sub_tasks.sub_task_id = :p_sub;

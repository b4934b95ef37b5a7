-- Parks a sub-task of a task whose rows are corrupt.
UPDATE agent_peer_sub_tasks
SET status='quarantined', resolved_by=:resolved_by::VARCHAR, result=:result::JSON, resolved_at=:p_now::FLOAT
WHERE agent_peer_sub_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_peer_sub_tasks.sub_task_id = :p_sub::VARCHAR;

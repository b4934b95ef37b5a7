-- Deletes every parallel invocation of a task.
DELETE
FROM agent_parallel_invocations
WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
  AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR;

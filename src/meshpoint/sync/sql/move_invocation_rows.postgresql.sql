-- Reads every invocation of a task.
SELECT agent_parallel_invocations.tenant_id, agent_parallel_invocations.logical_task_id,
  agent_parallel_invocations.invocation_id, agent_parallel_invocations.total_expected, agent_parallel_invocations.completed_count,
  agent_parallel_invocations.call_order, agent_parallel_invocations.results, agent_parallel_invocations.created_at
FROM agent_parallel_invocations
WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
  AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR
ORDER BY agent_parallel_invocations.invocation_id;

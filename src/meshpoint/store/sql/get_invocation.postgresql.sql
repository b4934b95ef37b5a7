-- Reads one parallel invocation.
SELECT agent_parallel_invocations.invocation_id, agent_parallel_invocations.call_order,
  agent_parallel_invocations.results
FROM agent_parallel_invocations
WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
  AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR
  AND agent_parallel_invocations.invocation_id = :p_invocation::VARCHAR;

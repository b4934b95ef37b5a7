-- Counts p_n more finished calls on an invocation and returns its counts.
UPDATE agent_parallel_invocations
SET completed_count=(agent_parallel_invocations.completed_count + :p_n::INTEGER)
WHERE agent_parallel_invocations.tenant_id = :p_tenant::VARCHAR
  AND agent_parallel_invocations.logical_task_id = :p_task::VARCHAR
  AND agent_parallel_invocations.invocation_id = :p_invocation::VARCHAR RETURNING agent_parallel_invocations.completed_count, agent_parallel_invocations.total_expected;

-- Counts p_n more finished calls on an invocation and returns its counts.
UPDATE agent_parallel_invocations
SET completed_count=(agent_parallel_invocations.completed_count + :p_n)
WHERE agent_parallel_invocations.tenant_id = :p_tenant
  AND agent_parallel_invocations.logical_task_id = :p_task
  AND agent_parallel_invocations.invocation_id = :p_invocation RETURNING completed_count, total_expected;

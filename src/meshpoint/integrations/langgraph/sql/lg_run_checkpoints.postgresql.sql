-- The checkpoints a run wrote, in every thread of the tenant.
SELECT agent_langgraph_checkpoints.thread_id, agent_langgraph_checkpoints.checkpoint_ns,
  agent_langgraph_checkpoints.checkpoint_id
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_checkpoints.run_id = :p_run::VARCHAR;

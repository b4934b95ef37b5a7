-- Deletes a thread's rows of agent_langgraph_checkpoints.
DELETE
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_checkpoints.thread_id = :p_thread::VARCHAR;

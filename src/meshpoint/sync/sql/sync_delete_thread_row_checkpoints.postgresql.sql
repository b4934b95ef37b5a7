-- Deletes one row of a LangGraph thread in agent_langgraph_checkpoints.
DELETE
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_checkpoints.thread_id = :p_thread::VARCHAR
  AND agent_langgraph_checkpoints.checkpoint_ns = :p_checkpoint_ns::VARCHAR
  AND agent_langgraph_checkpoints.checkpoint_id = :p_checkpoint_id::VARCHAR;

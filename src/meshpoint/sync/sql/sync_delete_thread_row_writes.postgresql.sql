-- Deletes one row of a LangGraph thread in agent_langgraph_writes.
DELETE
FROM agent_langgraph_writes
WHERE agent_langgraph_writes.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_writes.thread_id = :p_thread::VARCHAR
  AND agent_langgraph_writes.checkpoint_ns = :p_checkpoint_ns::VARCHAR
  AND agent_langgraph_writes.checkpoint_id = :p_checkpoint_id::VARCHAR
  AND agent_langgraph_writes.task_id = :p_task_id::VARCHAR
  AND agent_langgraph_writes.idx = :p_idx::INTEGER;

-- Reads a LangGraph thread's rows of agent_langgraph_checkpoints without their bytes.
SELECT agent_langgraph_checkpoints.tenant_id, agent_langgraph_checkpoints.thread_id,
  agent_langgraph_checkpoints.checkpoint_ns, agent_langgraph_checkpoints.checkpoint_id,
  agent_langgraph_checkpoints.parent_checkpoint_id, agent_langgraph_checkpoints.continues, agent_langgraph_checkpoints.run_id,
  agent_langgraph_checkpoints.hidden, agent_langgraph_checkpoints.blobs, agent_langgraph_checkpoints.metadata,
  agent_langgraph_checkpoints.digest, agent_langgraph_checkpoints.created_at
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_checkpoints.thread_id = :p_thread::VARCHAR;

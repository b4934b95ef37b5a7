-- Deletes one row of a LangGraph thread in agent_langgraph_blobs.
DELETE
FROM agent_langgraph_blobs
WHERE agent_langgraph_blobs.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_blobs.thread_id = :p_thread::VARCHAR
  AND agent_langgraph_blobs.checkpoint_ns = :p_checkpoint_ns::VARCHAR
  AND agent_langgraph_blobs.channel = :p_channel::VARCHAR
  AND agent_langgraph_blobs.version = :p_version::VARCHAR;

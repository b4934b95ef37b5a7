-- Reads a LangGraph thread's rows of agent_langgraph_blobs without their bytes.
SELECT agent_langgraph_blobs.tenant_id, agent_langgraph_blobs.thread_id,
  agent_langgraph_blobs.checkpoint_ns, agent_langgraph_blobs.channel, agent_langgraph_blobs.version,
  agent_langgraph_blobs.base_version, agent_langgraph_blobs.root_version, agent_langgraph_blobs.depth,
  agent_langgraph_blobs.items, agent_langgraph_blobs.digest
FROM agent_langgraph_blobs
WHERE agent_langgraph_blobs.tenant_id = :p_tenant::VARCHAR
  AND agent_langgraph_blobs.thread_id = :p_thread::VARCHAR;

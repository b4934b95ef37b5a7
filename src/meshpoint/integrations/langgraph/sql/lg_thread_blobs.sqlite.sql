-- A thread's channel versions and the version each extends.
SELECT agent_langgraph_blobs.checkpoint_ns, agent_langgraph_blobs.channel,
  agent_langgraph_blobs.version, agent_langgraph_blobs.base_version
FROM agent_langgraph_blobs
WHERE agent_langgraph_blobs.tenant_id = :p_tenant
  AND agent_langgraph_blobs.thread_id = :p_thread;

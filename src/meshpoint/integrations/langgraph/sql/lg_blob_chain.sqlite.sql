-- Every row of the value chain a channel version belongs to.
SELECT agent_langgraph_blobs.version, agent_langgraph_blobs.base_version,
  agent_langgraph_blobs.root_version, agent_langgraph_blobs.depth, agent_langgraph_blobs.items, agent_langgraph_blobs.data,
  agent_langgraph_blobs.digest
FROM agent_langgraph_blobs
WHERE agent_langgraph_blobs.tenant_id = :p_tenant
  AND agent_langgraph_blobs.thread_id = :p_thread
  AND agent_langgraph_blobs.checkpoint_ns = :p_ns
  AND agent_langgraph_blobs.channel = :p_channel
  AND agent_langgraph_blobs.root_version =
    (SELECT agent_langgraph_blobs.root_version
     FROM agent_langgraph_blobs
     WHERE agent_langgraph_blobs.tenant_id = :p_tenant
       AND agent_langgraph_blobs.thread_id = :p_thread
       AND agent_langgraph_blobs.checkpoint_ns = :p_ns
       AND agent_langgraph_blobs.channel = :p_channel
       AND agent_langgraph_blobs.version = :p_version);

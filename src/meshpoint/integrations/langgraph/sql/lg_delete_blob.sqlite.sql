-- Deletes a channel version no checkpoint needs any more.
DELETE
FROM agent_langgraph_blobs
WHERE agent_langgraph_blobs.tenant_id = :p_tenant
  AND agent_langgraph_blobs.thread_id = :p_thread
  AND agent_langgraph_blobs.checkpoint_ns = :p_ns
  AND agent_langgraph_blobs.channel = :p_channel
  AND agent_langgraph_blobs.version = :p_version;

-- Deletes a thread's rows of agent_langgraph_blobs.
DELETE
FROM agent_langgraph_blobs
WHERE agent_langgraph_blobs.tenant_id = :p_tenant
  AND agent_langgraph_blobs.thread_id = :p_thread;

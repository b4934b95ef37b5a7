-- Deletes a thread's rows of agent_langgraph_writes.
DELETE
FROM agent_langgraph_writes
WHERE agent_langgraph_writes.tenant_id = :p_tenant
  AND agent_langgraph_writes.thread_id = :p_thread;

-- Reads a LangGraph thread's rows of agent_langgraph_writes, whole.
SELECT agent_langgraph_writes.tenant_id, agent_langgraph_writes.thread_id,
  agent_langgraph_writes.checkpoint_ns, agent_langgraph_writes.checkpoint_id, agent_langgraph_writes.task_id,
  agent_langgraph_writes.idx, agent_langgraph_writes.channel, agent_langgraph_writes.task_path,
  agent_langgraph_writes.data, agent_langgraph_writes.digest
FROM agent_langgraph_writes
WHERE agent_langgraph_writes.tenant_id = :p_tenant
  AND agent_langgraph_writes.thread_id = :p_thread;

-- Copies a thread's rows of agent_langgraph_writes to another thread.
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
SELECT agent_langgraph_writes.tenant_id, :p_target AS anon_1,
  agent_langgraph_writes.checkpoint_ns, agent_langgraph_writes.checkpoint_id, agent_langgraph_writes.task_id,
  agent_langgraph_writes.idx, agent_langgraph_writes.channel, agent_langgraph_writes.task_path,
  agent_langgraph_writes.data, agent_langgraph_writes.digest
FROM agent_langgraph_writes
WHERE agent_langgraph_writes.tenant_id = :p_tenant
  AND agent_langgraph_writes.thread_id = :p_thread;

-- Deletes the writes pending on a checkpoint.
DELETE
FROM agent_langgraph_writes
WHERE agent_langgraph_writes.tenant_id = :p_tenant
  AND agent_langgraph_writes.thread_id = :p_thread
  AND agent_langgraph_writes.checkpoint_ns = :p_ns
  AND agent_langgraph_writes.checkpoint_id = :p_checkpoint;

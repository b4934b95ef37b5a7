-- Deletes a checkpoint.
DELETE
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant
  AND agent_langgraph_checkpoints.thread_id = :p_thread
  AND agent_langgraph_checkpoints.checkpoint_ns = :p_ns
  AND agent_langgraph_checkpoints.checkpoint_id = :p_checkpoint;

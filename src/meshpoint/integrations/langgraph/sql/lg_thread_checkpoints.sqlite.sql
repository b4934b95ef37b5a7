-- A thread's checkpoints (namespace, id, parent, whether hidden, the versions it holds values of, its metadata), for prune and cleanup.
SELECT agent_langgraph_checkpoints.checkpoint_ns, agent_langgraph_checkpoints.checkpoint_id,
  agent_langgraph_checkpoints.parent_checkpoint_id, agent_langgraph_checkpoints.hidden,
  CAST(agent_langgraph_checkpoints.blobs AS TEXT) AS blobs, agent_langgraph_checkpoints.metadata
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant
  AND agent_langgraph_checkpoints.thread_id = :p_thread;

-- Whether a thread has a checkpoint.
SELECT 1 AS anon_1
FROM agent_langgraph_checkpoints
WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant
  AND agent_langgraph_checkpoints.thread_id = :p_thread
LIMIT 1
OFFSET 0;

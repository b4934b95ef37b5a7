-- Walks a checkpoint's parent chain (itself first), up to a depth, returning each one's parent and the channel versions it holds values of.
WITH RECURSIVE ancestors(
                 checkpoint_id, parent_checkpoint_id, blobs, depth) AS
  (SELECT agent_langgraph_checkpoints.checkpoint_id AS checkpoint_id,
     agent_langgraph_checkpoints.parent_checkpoint_id AS parent_checkpoint_id, agent_langgraph_checkpoints.blobs AS blobs, 1 AS depth
   FROM agent_langgraph_checkpoints
   WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant::VARCHAR
     AND agent_langgraph_checkpoints.thread_id = :p_thread::VARCHAR
     AND agent_langgraph_checkpoints.checkpoint_ns = :p_ns::VARCHAR
     AND agent_langgraph_checkpoints.checkpoint_id = :p_checkpoint::VARCHAR
   UNION ALL SELECT agent_langgraph_checkpoints.checkpoint_id AS checkpoint_id,
     agent_langgraph_checkpoints.parent_checkpoint_id AS parent_checkpoint_id, agent_langgraph_checkpoints.blobs AS blobs, ancestors.depth + 1 AS anon_1
   FROM agent_langgraph_checkpoints
   JOIN ancestors ON agent_langgraph_checkpoints.checkpoint_id = ancestors.parent_checkpoint_id
   WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant::VARCHAR
     AND agent_langgraph_checkpoints.thread_id = :p_thread::VARCHAR
     AND agent_langgraph_checkpoints.checkpoint_ns = :p_ns::VARCHAR
     AND ancestors.depth < :p_max_depth::INTEGER)
SELECT ancestors.checkpoint_id, ancestors.parent_checkpoint_id,
  CAST(ancestors.blobs AS TEXT) AS blobs, ancestors.depth
FROM ancestors
ORDER BY ancestors.depth;

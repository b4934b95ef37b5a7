-- Inserts one whole row of agent_langgraph_checkpoints (a copied row).
INSERT INTO agent_langgraph_checkpoints (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
               continues, run_id, hidden, blobs, metadata, data, digest, created_at)
VALUES (:p_col_tenant_id, :p_col_thread_id, :p_col_checkpoint_ns, :p_col_checkpoint_id, :p_col_parent_checkpoint_id, :p_col_continues, :p_col_run_id, :p_col_hidden, :p_col_blobs, :p_col_metadata, :p_col_data, :p_col_digest, :p_col_created_at);

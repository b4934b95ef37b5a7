-- Inserts one whole row of agent_langgraph_checkpoints (a copied row).
INSERT INTO agent_langgraph_checkpoints (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
               continues, run_id, hidden, blobs, metadata, data, digest, created_at)
VALUES (:p_col_tenant_id::VARCHAR, :p_col_thread_id::VARCHAR, :p_col_checkpoint_ns::VARCHAR, :p_col_checkpoint_id::VARCHAR, :p_col_parent_checkpoint_id::VARCHAR, :p_col_continues::VARCHAR, :p_col_run_id::VARCHAR, :p_col_hidden::BOOLEAN, :p_col_blobs::JSON, :p_col_metadata::JSONB, :p_col_data::BYTEA, :p_col_digest::VARCHAR, :p_col_created_at::FLOAT);

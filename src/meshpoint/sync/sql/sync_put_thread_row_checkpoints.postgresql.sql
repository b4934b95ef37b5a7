-- Inserts one row of a LangGraph thread in agent_langgraph_checkpoints.
INSERT INTO agent_langgraph_checkpoints (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
               continues, run_id, hidden, blobs, metadata, data, digest, created_at)
VALUES (:p_tenant::VARCHAR, :p_thread_id::VARCHAR, :p_checkpoint_ns::VARCHAR, :p_checkpoint_id::VARCHAR, :p_parent_checkpoint_id::VARCHAR, :p_continues::VARCHAR, :p_run_id::VARCHAR, :p_hidden::BOOLEAN, :p_blobs::JSON, :p_metadata::JSONB, :p_data::BYTEA, :p_digest::VARCHAR, :p_created_at::FLOAT);

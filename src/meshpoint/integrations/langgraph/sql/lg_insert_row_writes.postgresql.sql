-- Inserts one whole row of agent_langgraph_writes (a copied row).
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
VALUES (:p_col_tenant_id::VARCHAR, :p_col_thread_id::VARCHAR, :p_col_checkpoint_ns::VARCHAR, :p_col_checkpoint_id::VARCHAR, :p_col_task_id::VARCHAR, :p_col_idx::INTEGER, :p_col_channel::VARCHAR, :p_col_task_path::VARCHAR, :p_col_data::BYTEA, :p_col_digest::VARCHAR);

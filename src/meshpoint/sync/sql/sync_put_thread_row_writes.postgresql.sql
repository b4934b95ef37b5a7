-- Inserts one row of a LangGraph thread in agent_langgraph_writes.
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
VALUES (:p_tenant::VARCHAR, :p_thread_id::VARCHAR, :p_checkpoint_ns::VARCHAR, :p_checkpoint_id::VARCHAR, :p_task_id::VARCHAR, :p_idx::INTEGER, :p_channel::VARCHAR, :p_task_path::VARCHAR, :p_data::BYTEA, :p_digest::VARCHAR);

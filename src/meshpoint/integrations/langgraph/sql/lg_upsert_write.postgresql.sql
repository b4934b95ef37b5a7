-- Stores a task's special write (error, interrupt, resume, scheduled), replacing the one stored under its (task, index).
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
VALUES (:p_tenant::VARCHAR, :p_thread::VARCHAR, :p_ns::VARCHAR, :p_checkpoint::VARCHAR, :p_task::VARCHAR, :p_idx::INTEGER, :p_channel::VARCHAR, :p_task_path::VARCHAR, :p_data::BYTEA, :p_digest::VARCHAR) ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO
UPDATE
SET channel = excluded.channel, task_path = excluded.task_path, data = excluded.data, digest = excluded.digest;

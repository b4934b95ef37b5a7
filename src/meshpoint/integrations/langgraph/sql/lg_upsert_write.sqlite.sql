-- Stores a task's special write (error, interrupt, resume, scheduled), replacing the one stored under its (task, index).
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
VALUES (:p_tenant, :p_thread, :p_ns, :p_checkpoint, :p_task, :p_idx, :p_channel, :p_task_path, :p_data, :p_digest) ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO
UPDATE
SET channel = excluded.channel, task_path = excluded.task_path, data = excluded.data, digest = excluded.digest;

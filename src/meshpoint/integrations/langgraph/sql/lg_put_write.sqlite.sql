-- Stores a task's write on a checkpoint, unless that (task, index) is stored already (a task's writes are idempotent).
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
VALUES (:p_tenant, :p_thread, :p_ns, :p_checkpoint, :p_task, :p_idx, :p_channel, :p_task_path, :p_data, :p_digest) ON CONFLICT DO NOTHING;

-- Inserts a task's end unless the cloud holds one (an end is never replaced: the caller compares what is there).
INSERT INTO agent_ended_tasks (
               tenant_id, logical_task_id, agent_name, ended_at)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_agent_name::VARCHAR, :p_ended_at::FLOAT) ON CONFLICT DO NOTHING;

-- Inserts a task's end, or replaces the cloud's if this one is later (last write wins).
INSERT INTO agent_ended_tasks (
               tenant_id, logical_task_id, agent_name, ended_at)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_agent_name::VARCHAR, :p_ended_at::FLOAT) ON CONFLICT (tenant_id, logical_task_id) DO
UPDATE
SET agent_name = excluded.agent_name, ended_at = excluded.ended_at
WHERE agent_ended_tasks.ended_at < excluded.ended_at;

-- Reads the time of the oldest checkpoint.
SELECT min(agent_paused_tasks.checkpointed_at) AS min_1
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant;

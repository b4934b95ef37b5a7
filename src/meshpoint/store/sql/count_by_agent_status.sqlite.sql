-- Counts paused tasks by agent and status.
SELECT agent_paused_tasks.agent_name, agent_paused_tasks.status, count(*) AS count_1
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant
GROUP BY agent_paused_tasks.agent_name, agent_paused_tasks.status;

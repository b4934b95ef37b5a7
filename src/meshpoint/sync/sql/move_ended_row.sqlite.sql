-- Reads a task's row in the ledger of ended tasks.
SELECT agent_ended_tasks.tenant_id, agent_ended_tasks.logical_task_id,
  agent_ended_tasks.agent_name, agent_ended_tasks.ended_at
FROM agent_ended_tasks
WHERE agent_ended_tasks.tenant_id = :p_tenant
  AND agent_ended_tasks.logical_task_id = :p_task;

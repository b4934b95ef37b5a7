-- Reads a paused task's whole row.
SELECT agent_paused_tasks.tenant_id, agent_paused_tasks.logical_task_id,
  agent_paused_tasks.agent_name, agent_paused_tasks.status, agent_paused_tasks.current_invocation_id,
  agent_paused_tasks.context, agent_paused_tasks.context_encoding, agent_paused_tasks.context_sha256,
  agent_paused_tasks.session_event_count, agent_paused_tasks.owner, agent_paused_tasks.lease_expires_at, agent_paused_tasks.version,
  agent_paused_tasks.created_at, agent_paused_tasks.checkpointed_at, agent_paused_tasks.expires_at,
  agent_paused_tasks.recoveries
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task;

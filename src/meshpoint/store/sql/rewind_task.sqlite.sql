-- Rewrites a task's row, for the holder of its lease, with the state of an earlier checkpoint or a fresh one, ready to resume by agent p_agent (a handoff at a phase change hands the task to the next phase's agent).
UPDATE agent_paused_tasks
SET agent_name=:p_agent, status='resuming', current_invocation_id=:p_invocation,
  context=:p_context, context_encoding=:p_encoding, context_sha256=:p_sha256,
  session_event_count=:p_event_count, version=(agent_paused_tasks.version + 1), checkpointed_at=:p_now
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task
  AND agent_paused_tasks.owner = :p_owner;

-- Rewrites a task's row, for the holder of its lease, with the state of an earlier checkpoint or a fresh one, ready to resume by agent p_agent (a handoff at a phase change hands the task to the next phase's agent).
UPDATE agent_paused_tasks
SET agent_name=:p_agent::VARCHAR, status='resuming',
  current_invocation_id=:p_invocation::VARCHAR, context=:p_context::BYTEA, context_encoding=:p_encoding::VARCHAR,
  context_sha256=:p_sha256::VARCHAR, session_event_count=:p_event_count::INTEGER, version=(agent_paused_tasks.version + 1), checkpointed_at=:p_now::FLOAT
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_paused_tasks.owner = :p_owner::VARCHAR;

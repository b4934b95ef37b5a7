-- Rewrites the row of a resumed task for the holder of its lease, from the conversation it restored, for the task's own agent, and releases the lease (or keeps it, for a mid-turn checkpoint).
UPDATE agent_paused_tasks
SET status=:p_status, current_invocation_id=:p_invocation, context=:p_context,
  context_encoding=:p_encoding, context_sha256=:p_sha256, session_event_count=:p_event_count, owner=:p_holder, lease_expires_at=:p_hold_until, version=(agent_paused_tasks.version + 1), checkpointed_at=:p_now, expires_at=:p_expires_at, recoveries=CASE
                                                                                                                                                                                                                                                          WHEN (:p_status = 'working'
                                                                                                                                                                                                                                                                AND :p_event_count <= agent_paused_tasks.session_event_count) THEN agent_paused_tasks.recoveries
                                                                                                                                                                                                                                                          ELSE 0
                                                                                                                                                                                                                                                      END
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task
  AND agent_paused_tasks.owner = :p_owner
  AND agent_paused_tasks.session_event_count = :p_first
  AND agent_paused_tasks.agent_name = :p_agent RETURNING version;

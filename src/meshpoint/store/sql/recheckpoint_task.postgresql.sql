-- Rewrites the row of a resumed task for the holder of its lease, from the conversation it restored, for the task's own agent, and releases the lease (or keeps it, for a mid-turn checkpoint).
UPDATE agent_paused_tasks
SET status=:p_status::VARCHAR, current_invocation_id=:p_invocation::VARCHAR,
  context=:p_context::BYTEA, context_encoding=:p_encoding::VARCHAR, context_sha256=:p_sha256::VARCHAR,
  session_event_count=:p_event_count::INTEGER, owner=:p_holder::VARCHAR, lease_expires_at=:p_hold_until::FLOAT, version=(agent_paused_tasks.version + 1), checkpointed_at=:p_now::FLOAT, expires_at=:p_expires_at::FLOAT, recoveries=CASE
                                                                                                                                                                                                                                         WHEN (:p_status::VARCHAR = 'working'
                                                                                                                                                                                                                                               AND :p_event_count::INTEGER <= agent_paused_tasks.session_event_count) THEN agent_paused_tasks.recoveries
                                                                                                                                                                                                                                         ELSE 0
                                                                                                                                                                                                                                     END
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
  AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
  AND agent_paused_tasks.owner = :p_owner::VARCHAR
  AND agent_paused_tasks.session_event_count = :p_first::INTEGER
  AND agent_paused_tasks.agent_name = :p_agent::VARCHAR RETURNING agent_paused_tasks.version;

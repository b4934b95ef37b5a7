-- Holds a paused task for its move: its lease taken, never to expire, if it waits on peers or for approval and nobody holds it.
UPDATE agent_paused_tasks
SET owner=:p_owner, lease_expires_at=:p_until, version=(agent_paused_tasks.version + 1)
WHERE agent_paused_tasks.tenant_id = :p_tenant
  AND agent_paused_tasks.logical_task_id = :p_task
  AND (agent_paused_tasks.status = 'waiting_peers'
       OR agent_paused_tasks.status = 'input_required')
  AND (agent_paused_tasks.owner IS NULL
       OR agent_paused_tasks.lease_expires_at <= :p_now) RETURNING version;

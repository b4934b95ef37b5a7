-- Reads the next rows of agent_ended_tasks after a position, in commit order (rowid), but the ends of tasks moved to the cloud.
SELECT rowid AS sync_rowid, agent_ended_tasks.tenant_id, agent_ended_tasks.logical_task_id,
  agent_ended_tasks.agent_name, agent_ended_tasks.ended_at
FROM agent_ended_tasks
WHERE agent_ended_tasks.tenant_id = :p_tenant
  AND rowid > :p_after
  AND NOT (EXISTS
             (SELECT meshpoint_sync_moves.logical_task_id
              FROM meshpoint_sync_moves
              WHERE meshpoint_sync_moves.tenant_id = :p_tenant
                AND meshpoint_sync_moves.logical_task_id = agent_ended_tasks.logical_task_id
                AND meshpoint_sync_moves.state = 'moved'))
ORDER BY rowid
LIMIT :p_limit
OFFSET 0;

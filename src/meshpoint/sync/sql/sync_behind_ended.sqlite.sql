-- Counts the rows of agent_ended_tasks after a position.
SELECT count(*) AS count_1
FROM agent_ended_tasks
WHERE agent_ended_tasks.tenant_id = :p_tenant
  AND rowid > :p_after
  AND NOT (EXISTS
             (SELECT meshpoint_sync_moves.logical_task_id
              FROM meshpoint_sync_moves
              WHERE meshpoint_sync_moves.tenant_id = :p_tenant
                AND meshpoint_sync_moves.logical_task_id = agent_ended_tasks.logical_task_id
                AND meshpoint_sync_moves.state = 'moved'));

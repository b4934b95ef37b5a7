-- Forgets a move that was given up (the task stays local).
DELETE
FROM meshpoint_sync_moves
WHERE meshpoint_sync_moves.tenant_id = :p_tenant
  AND meshpoint_sync_moves.logical_task_id = :p_task
  AND meshpoint_sync_moves.move_id = :p_move;

-- Marks a move moved (local) once the task's rows were released.
UPDATE meshpoint_sync_moves
SET state='moved', finished_at=:p_now::FLOAT
WHERE meshpoint_sync_moves.tenant_id = :p_tenant::VARCHAR
  AND meshpoint_sync_moves.logical_task_id = :p_task::VARCHAR
  AND meshpoint_sync_moves.move_id = :p_move::VARCHAR;

-- Reads a task's rows in the ledger of moves, the latest first.
SELECT meshpoint_sync_moves.tenant_id, meshpoint_sync_moves.logical_task_id,
  meshpoint_sync_moves.move_id, meshpoint_sync_moves.agent_name, meshpoint_sync_moves.state,
  meshpoint_sync_moves.source_id, meshpoint_sync_moves.destination, meshpoint_sync_moves.started_at,
  meshpoint_sync_moves.finished_at
FROM meshpoint_sync_moves
WHERE meshpoint_sync_moves.tenant_id = :p_tenant
  AND meshpoint_sync_moves.logical_task_id = :p_task
ORDER BY meshpoint_sync_moves.started_at DESC, meshpoint_sync_moves.move_id DESC;

-- Lists the tenant's moves under way (left half-way by a crash).
SELECT meshpoint_sync_moves.logical_task_id
FROM meshpoint_sync_moves
WHERE meshpoint_sync_moves.tenant_id = :p_tenant::VARCHAR
  AND meshpoint_sync_moves.state = 'leaving'
ORDER BY meshpoint_sync_moves.logical_task_id;

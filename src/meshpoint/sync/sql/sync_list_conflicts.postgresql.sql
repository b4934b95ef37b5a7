-- Lists the tenant's conflict log, oldest first.
SELECT meshpoint_sync_conflicts.tenant_id, meshpoint_sync_conflicts.source_id,
  meshpoint_sync_conflicts.table_name, meshpoint_sync_conflicts.row_key, meshpoint_sync_conflicts.kind,
  meshpoint_sync_conflicts.reason, meshpoint_sync_conflicts.local_row, meshpoint_sync_conflicts.cloud_row,
  meshpoint_sync_conflicts.detected_at
FROM meshpoint_sync_conflicts
WHERE meshpoint_sync_conflicts.tenant_id = :p_tenant::VARCHAR
ORDER BY meshpoint_sync_conflicts.detected_at, meshpoint_sync_conflicts.table_name,
  meshpoint_sync_conflicts.row_key;

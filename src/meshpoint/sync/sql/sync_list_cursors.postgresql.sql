-- Lists the tenant's cursors, by source and table.
SELECT meshpoint_sync_cursors.tenant_id, meshpoint_sync_cursors.source_id,
  meshpoint_sync_cursors.table_name, meshpoint_sync_cursors.position, meshpoint_sync_cursors.position_key,
  meshpoint_sync_cursors.rows_applied, meshpoint_sync_cursors.updated_at
FROM meshpoint_sync_cursors
WHERE meshpoint_sync_cursors.tenant_id = :p_tenant::VARCHAR
ORDER BY meshpoint_sync_cursors.source_id, meshpoint_sync_cursors.table_name;

-- Reads a source table's cursor.
SELECT meshpoint_sync_cursors.position, meshpoint_sync_cursors.position_key,
  meshpoint_sync_cursors.rows_applied, meshpoint_sync_cursors.updated_at
FROM meshpoint_sync_cursors
WHERE meshpoint_sync_cursors.tenant_id = :p_tenant
  AND meshpoint_sync_cursors.source_id = :p_source
  AND meshpoint_sync_cursors.table_name = :p_table;

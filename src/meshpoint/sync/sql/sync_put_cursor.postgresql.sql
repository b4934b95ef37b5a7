-- Moves a source table's cursor to the last row of the batch applied in this transaction.
INSERT INTO meshpoint_sync_cursors (
               tenant_id, source_id, table_name, position, position_key, rows_applied, updated_at)
VALUES (:p_tenant::VARCHAR, :p_source::VARCHAR, :p_table::VARCHAR, :p_position::BIGINT, :p_position_key::VARCHAR, :p_rows::BIGINT, :p_now::FLOAT) ON CONFLICT (tenant_id, source_id, table_name) DO
UPDATE
SET position = excluded.position, position_key = excluded.position_key,
  rows_applied = (meshpoint_sync_cursors.rows_applied + excluded.rows_applied), updated_at = excluded.updated_at;

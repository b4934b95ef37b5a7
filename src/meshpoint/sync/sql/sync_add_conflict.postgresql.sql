-- Logs a row the sync did not apply (once per row and kind).
INSERT INTO meshpoint_sync_conflicts (
               tenant_id, source_id, table_name, row_key, kind, reason, local_row, cloud_row,
               detected_at)
VALUES (:p_tenant::VARCHAR, :p_source_id::VARCHAR, :p_table_name::VARCHAR, :p_row_key::VARCHAR, :p_kind::VARCHAR, :p_reason::VARCHAR, :p_local_row::JSON, :p_cloud_row::JSON, :p_detected_at::FLOAT) ON CONFLICT DO NOTHING;

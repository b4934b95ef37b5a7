-- Names this database as a sync source (at its first sync).
INSERT INTO meshpoint_sync_sources (
               tenant_id, source_id, created_at)
VALUES (:p_tenant, :p_source, :p_now);

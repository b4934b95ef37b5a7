-- Reads this database's id as a sync source.
SELECT meshpoint_sync_sources.source_id
FROM meshpoint_sync_sources
WHERE meshpoint_sync_sources.tenant_id = :p_tenant;

-- Reads the tenant's largest change sequence number of LangGraph threads.
SELECT coalesce(max(meshpoint_sync_thread_changes.change_seq), 0) AS coalesce_1
FROM meshpoint_sync_thread_changes
WHERE meshpoint_sync_thread_changes.tenant_id = :p_tenant;

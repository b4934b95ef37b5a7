-- Counts the LangGraph threads changed after a change sequence number.
SELECT count(*) AS count_1
FROM meshpoint_sync_thread_changes
WHERE meshpoint_sync_thread_changes.tenant_id = :p_tenant
  AND meshpoint_sync_thread_changes.change_seq > :p_after;

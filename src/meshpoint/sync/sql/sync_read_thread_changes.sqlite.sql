-- Reads the next changed LangGraph threads after a change sequence number, in commit order.
SELECT meshpoint_sync_thread_changes.change_seq AS sync_rowid,
  meshpoint_sync_thread_changes.thread_id
FROM meshpoint_sync_thread_changes
WHERE meshpoint_sync_thread_changes.tenant_id = :p_tenant
  AND meshpoint_sync_thread_changes.change_seq > :p_after
ORDER BY meshpoint_sync_thread_changes.change_seq
LIMIT :p_limit
OFFSET 0;

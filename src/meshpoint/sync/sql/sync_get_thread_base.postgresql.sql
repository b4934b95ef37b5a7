-- Reads the fingerprint of a LangGraph thread as this source last left it in the cloud.
SELECT meshpoint_sync_threads.version, meshpoint_sync_threads.fingerprint
FROM meshpoint_sync_threads
WHERE meshpoint_sync_threads.tenant_id = :p_tenant::VARCHAR
  AND meshpoint_sync_threads.source_id = :p_source::VARCHAR
  AND meshpoint_sync_threads.thread_id = :p_thread::VARCHAR;

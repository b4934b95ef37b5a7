-- Records the fingerprint of a LangGraph thread as this source leaves it in the cloud (unchanged if it is the same).
INSERT INTO meshpoint_sync_threads (
               tenant_id, source_id, thread_id, version, fingerprint, synced_at)
VALUES (:p_tenant::VARCHAR, :p_source::VARCHAR, :p_thread::VARCHAR, :p_version::VARCHAR, :p_fingerprint::VARCHAR, :p_now::FLOAT) ON CONFLICT (tenant_id, source_id, thread_id) DO
UPDATE
SET version = excluded.version, fingerprint = excluded.fingerprint, synced_at = excluded.synced_at
WHERE meshpoint_sync_threads.fingerprint != excluded.fingerprint;

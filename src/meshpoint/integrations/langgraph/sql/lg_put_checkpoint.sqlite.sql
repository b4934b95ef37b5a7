-- Stores a LangGraph checkpoint (again, if its id is stored: LangGraph's savers overwrite); a second loop step continuing one parent fails the unique index on continues.
INSERT INTO agent_langgraph_checkpoints (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
               continues, run_id, hidden, blobs, metadata, data, digest, created_at)
VALUES (:p_tenant, :p_thread, :p_ns, :p_checkpoint, :p_parent, :p_continues, :p_run, 0, :p_blobs, :p_metadata, :p_data, :p_digest, :p_now) ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id) DO
UPDATE
SET parent_checkpoint_id = excluded.parent_checkpoint_id, continues = excluded.continues,
  run_id = excluded.run_id, hidden = excluded.hidden, blobs = excluded.blobs, metadata = excluded.metadata, data = excluded.data, digest = excluded.digest, created_at = excluded.created_at;

-- Stores a LangGraph checkpoint (again, if its id is stored: LangGraph's savers overwrite); a second loop step continuing one parent fails the unique index on continues.
INSERT INTO agent_langgraph_checkpoints (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
               continues, run_id, hidden, blobs, metadata, data, digest, created_at)
VALUES (:p_tenant::VARCHAR, :p_thread::VARCHAR, :p_ns::VARCHAR, :p_checkpoint::VARCHAR, :p_parent::VARCHAR, :p_continues::VARCHAR, :p_run::VARCHAR, false, :p_blobs::JSON, :p_metadata::JSONB, :p_data::BYTEA, :p_digest::VARCHAR, :p_now::FLOAT) ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id) DO
UPDATE
SET parent_checkpoint_id = excluded.parent_checkpoint_id, continues = excluded.continues,
  run_id = excluded.run_id, hidden = excluded.hidden, blobs = excluded.blobs, metadata = excluded.metadata, data = excluded.data, digest = excluded.digest, created_at = excluded.created_at;

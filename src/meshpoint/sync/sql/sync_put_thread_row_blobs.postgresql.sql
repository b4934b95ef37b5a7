-- Inserts one row of a LangGraph thread in agent_langgraph_blobs.
INSERT INTO agent_langgraph_blobs (
               tenant_id, thread_id, checkpoint_ns, channel, version, base_version, root_version,
               depth, items, data, digest)
VALUES (:p_tenant::VARCHAR, :p_thread_id::VARCHAR, :p_checkpoint_ns::VARCHAR, :p_channel::VARCHAR, :p_version::VARCHAR, :p_base_version::VARCHAR, :p_root_version::VARCHAR, :p_depth::INTEGER, :p_items::INTEGER, :p_data::BYTEA, :p_digest::VARCHAR);

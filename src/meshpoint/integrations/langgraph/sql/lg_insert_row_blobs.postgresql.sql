-- Inserts one whole row of agent_langgraph_blobs (a copied row).
INSERT INTO agent_langgraph_blobs (
               tenant_id, thread_id, checkpoint_ns, channel, version, base_version, root_version,
               depth, items, data, digest)
VALUES (:p_col_tenant_id::VARCHAR, :p_col_thread_id::VARCHAR, :p_col_checkpoint_ns::VARCHAR, :p_col_channel::VARCHAR, :p_col_version::VARCHAR, :p_col_base_version::VARCHAR, :p_col_root_version::VARCHAR, :p_col_depth::INTEGER, :p_col_items::INTEGER, :p_col_data::BYTEA, :p_col_digest::VARCHAR);

-- Inserts one whole row of agent_langgraph_blobs (a copied row).
INSERT INTO agent_langgraph_blobs (
               tenant_id, thread_id, checkpoint_ns, channel, version, base_version, root_version,
               depth, items, data, digest)
VALUES (:p_col_tenant_id, :p_col_thread_id, :p_col_checkpoint_ns, :p_col_channel, :p_col_version, :p_col_base_version, :p_col_root_version, :p_col_depth, :p_col_items, :p_col_data, :p_col_digest);

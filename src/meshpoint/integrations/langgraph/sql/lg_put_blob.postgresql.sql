-- Stores a channel version's value, or the items a list gained since its base version if that is stored; nothing if the version is stored already.
INSERT INTO agent_langgraph_blobs (
               tenant_id, thread_id, checkpoint_ns, channel, version, base_version, root_version,
               depth, items, data, digest)
SELECT :p_tenant::VARCHAR AS anon_1, :p_thread::VARCHAR AS anon_2, :p_ns::VARCHAR AS anon_3,
  :p_channel::VARCHAR AS anon_4, :p_version::VARCHAR AS anon_5, :p_base::VARCHAR AS anon_6, :p_root::VARCHAR AS anon_7,
  :p_depth::INTEGER AS anon_8, :p_items::INTEGER AS anon_9, :p_data::BYTEA AS anon_10, :p_digest::VARCHAR AS anon_11
WHERE :p_base::VARCHAR IS NULL
  OR (EXISTS
        (SELECT 1 AS anon_12
         FROM agent_langgraph_blobs
         WHERE agent_langgraph_blobs.tenant_id = :p_tenant::VARCHAR
           AND agent_langgraph_blobs.thread_id = :p_thread::VARCHAR
           AND agent_langgraph_blobs.checkpoint_ns = :p_ns::VARCHAR
           AND agent_langgraph_blobs.channel = :p_channel::VARCHAR
           AND agent_langgraph_blobs.version = :p_base::VARCHAR)) ON CONFLICT DO NOTHING;

-- Stores a channel version's value, or the items a list gained since its base version if that is stored; nothing if the version is stored already.
INSERT INTO agent_langgraph_blobs (
               tenant_id, thread_id, checkpoint_ns, channel, version, base_version, root_version,
               depth, items, data, digest)
SELECT :p_tenant AS anon_1, :p_thread AS anon_2, :p_ns AS anon_3, :p_channel AS anon_4,
  :p_version AS anon_5, :p_base AS anon_6, :p_root AS anon_7, :p_depth AS anon_8, :p_items AS anon_9,
  :p_data AS anon_10, :p_digest AS anon_11
WHERE :p_base IS NULL
  OR (EXISTS
        (SELECT 1 AS anon_12
         FROM agent_langgraph_blobs
         WHERE agent_langgraph_blobs.tenant_id = :p_tenant
           AND agent_langgraph_blobs.thread_id = :p_thread
           AND agent_langgraph_blobs.checkpoint_ns = :p_ns
           AND agent_langgraph_blobs.channel = :p_channel
           AND agent_langgraph_blobs.version = :p_base)) ON CONFLICT DO NOTHING;

-- Reads the latest checkpoint of a thread's namespace with its values and pending writes.
WITH
  targets AS
  (SELECT agent_langgraph_checkpoints.thread_id AS thread_id,
     agent_langgraph_checkpoints.checkpoint_ns AS checkpoint_ns, agent_langgraph_checkpoints.checkpoint_id AS checkpoint_id,
     agent_langgraph_checkpoints.parent_checkpoint_id AS parent_checkpoint_id, agent_langgraph_checkpoints.blobs AS blobs, agent_langgraph_checkpoints.data AS data,
     agent_langgraph_checkpoints.digest AS digest
   FROM agent_langgraph_checkpoints
   WHERE agent_langgraph_checkpoints.tenant_id = :p_tenant
     AND agent_langgraph_checkpoints.thread_id = :p_thread
     AND agent_langgraph_checkpoints.checkpoint_ns = :p_ns
     AND agent_langgraph_checkpoints.hidden IS 0
   ORDER BY agent_langgraph_checkpoints.checkpoint_id DESC
   LIMIT 1
   OFFSET 0),
  refs AS
  (SELECT targets.thread_id AS thread_id, targets.checkpoint_ns AS checkpoint_ns,
     refs."key" AS channel, refs.value AS version
   FROM targets
   JOIN json_each(targets.blobs) AS refs ON 1 = 1),
  roots AS
  (SELECT DISTINCT agent_langgraph_blobs.thread_id AS thread_id,
     agent_langgraph_blobs.checkpoint_ns AS checkpoint_ns, agent_langgraph_blobs.channel AS channel,
     agent_langgraph_blobs.root_version AS root_version
   FROM refs
   CROSS JOIN agent_langgraph_blobs ON agent_langgraph_blobs.tenant_id = :p_tenant
   AND agent_langgraph_blobs.thread_id = refs.thread_id
   AND agent_langgraph_blobs.checkpoint_ns = refs.checkpoint_ns
   AND agent_langgraph_blobs.channel = refs.channel
   AND agent_langgraph_blobs.version = refs.version)
SELECT read_rows.kind, read_rows.thread_id, read_rows.checkpoint_ns, read_rows.a, read_rows.b,
  read_rows.c, read_rows.d, read_rows.n, read_rows.m, read_rows.data, read_rows.digest
FROM
  (SELECT 0 AS kind, targets.thread_id AS thread_id, targets.checkpoint_ns AS checkpoint_ns,
     targets.checkpoint_id AS a, targets.parent_checkpoint_id AS b, CAST(targets.blobs AS TEXT) AS c,
     CAST(NULL AS TEXT) AS d, CAST(NULL AS INTEGER) AS n, CAST(NULL AS INTEGER) AS m, targets.data AS data,
     targets.digest AS digest
   FROM targets
   UNION ALL SELECT 1 AS anon_1, agent_langgraph_blobs.thread_id AS thread_id,
     agent_langgraph_blobs.checkpoint_ns AS checkpoint_ns, agent_langgraph_blobs.channel AS channel, agent_langgraph_blobs.version AS version,
     agent_langgraph_blobs.base_version AS base_version, agent_langgraph_blobs.root_version AS root_version,
     agent_langgraph_blobs.depth AS depth, agent_langgraph_blobs.items AS items, agent_langgraph_blobs.data AS data,
     agent_langgraph_blobs.digest AS digest
   FROM roots
   CROSS JOIN agent_langgraph_blobs ON agent_langgraph_blobs.tenant_id = :p_tenant
   AND agent_langgraph_blobs.thread_id = roots.thread_id
   AND agent_langgraph_blobs.checkpoint_ns = roots.checkpoint_ns
   AND agent_langgraph_blobs.channel = roots.channel
   AND agent_langgraph_blobs.root_version = roots.root_version
   UNION ALL SELECT 2 AS anon_2, agent_langgraph_writes.thread_id AS thread_id,
     agent_langgraph_writes.checkpoint_ns AS checkpoint_ns, agent_langgraph_writes.checkpoint_id AS checkpoint_id,
     agent_langgraph_writes.task_id AS task_id, agent_langgraph_writes.channel AS channel,
     agent_langgraph_writes.task_path AS task_path, agent_langgraph_writes.idx AS idx, CAST(NULL AS INTEGER) AS anon_3,
     agent_langgraph_writes.data AS data, agent_langgraph_writes.digest AS digest
   FROM targets
   CROSS JOIN agent_langgraph_writes ON agent_langgraph_writes.tenant_id = :p_tenant
   AND agent_langgraph_writes.thread_id = targets.thread_id
   AND agent_langgraph_writes.checkpoint_ns = targets.checkpoint_ns
   AND agent_langgraph_writes.checkpoint_id = targets.checkpoint_id) AS read_rows;

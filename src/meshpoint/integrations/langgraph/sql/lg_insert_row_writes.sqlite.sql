-- Inserts one whole row of agent_langgraph_writes (a copied row).
INSERT INTO agent_langgraph_writes (
               tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
               task_path, data, digest)
VALUES (:p_col_tenant_id, :p_col_thread_id, :p_col_checkpoint_ns, :p_col_checkpoint_id, :p_col_task_id, :p_col_idx, :p_col_channel, :p_col_task_path, :p_col_data, :p_col_digest);

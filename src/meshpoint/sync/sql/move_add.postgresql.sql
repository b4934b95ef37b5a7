-- Records a move in the ledger of moves.
INSERT INTO meshpoint_sync_moves (
               tenant_id, logical_task_id, move_id, agent_name, state, source_id, destination,
               started_at, finished_at)
VALUES (:p_tenant::VARCHAR, :p_logical_task_id::VARCHAR, :p_move_id::VARCHAR, :p_agent_name::VARCHAR, :p_state::VARCHAR, :p_source_id::VARCHAR, :p_destination::VARCHAR, :p_started_at::FLOAT, :p_finished_at::FLOAT);

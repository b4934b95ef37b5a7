-- Records a move in the ledger of moves.
INSERT INTO meshpoint_sync_moves (
               tenant_id, logical_task_id, move_id, agent_name, state, source_id, destination,
               started_at, finished_at)
VALUES (:p_tenant, :p_logical_task_id, :p_move_id, :p_agent_name, :p_state, :p_source_id, :p_destination, :p_started_at, :p_finished_at);

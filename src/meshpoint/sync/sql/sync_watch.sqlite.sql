-- Reads the largest rowid of each table that travels, and the largest change sequence number of LangGraph threads.
SELECT
  (SELECT max(rowid) AS max_1
   FROM agent_checkpoints) AS agent_checkpoints,

  (SELECT max(rowid) AS max_2
   FROM agent_events) AS agent_events,
  (SELECT max(rowid) AS max_3
   FROM agent_ended_tasks) AS agent_ended_tasks,

  (SELECT max(meshpoint_sync_thread_changes.change_seq) AS max_4
   FROM meshpoint_sync_thread_changes) AS langgraph_threads;

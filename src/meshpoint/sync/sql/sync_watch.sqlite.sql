-- Reads the largest rowid of each table that travels.
SELECT
  (SELECT max(rowid) AS max_1
   FROM agent_checkpoints) AS agent_checkpoints,

  (SELECT max(rowid) AS max_2
   FROM agent_events) AS agent_events,
  (SELECT max(rowid) AS max_3
   FROM agent_ended_tasks) AS agent_ended_tasks;

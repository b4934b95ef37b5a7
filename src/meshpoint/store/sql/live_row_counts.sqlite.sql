-- Counts the rows of every live table, across tenants.
SELECT
  (SELECT count(*) AS count_1
   FROM agent_peer_sub_tasks) AS agent_peer_sub_tasks,

  (SELECT count(*) AS count_2
   FROM agent_parallel_invocations) AS agent_parallel_invocations,
  (SELECT count(*) AS count_3
   FROM agent_session_events) AS agent_session_events,

  (SELECT count(*) AS count_4
   FROM agent_paused_tasks) AS agent_paused_tasks;

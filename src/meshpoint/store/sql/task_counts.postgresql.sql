-- Counts paused tasks as expired, waiting for input, working (or resuming), or waiting on peers, each once, and reads the oldest and mean checkpoint time.
SELECT count(*) AS count_1,
  count(CASE
            WHEN (:p_expiring::BOOLEAN
                  AND agent_paused_tasks.checkpointed_at < :p_before::FLOAT) THEN 1
        END) AS count_2,
  count(CASE
            WHEN (:p_expiring::BOOLEAN
                  AND agent_paused_tasks.checkpointed_at < :p_before::FLOAT) THEN NULL WHEN (agent_paused_tasks.status = 'input_required') THEN 1
        END) AS count_3,
  count(CASE
            WHEN (:p_expiring::BOOLEAN
                  AND agent_paused_tasks.checkpointed_at < :p_before::FLOAT) THEN NULL
            WHEN (agent_paused_tasks.status = 'working'
                  OR agent_paused_tasks.status = 'resuming') THEN 1
        END) AS count_4, min(agent_paused_tasks.checkpointed_at) AS min_1,
  avg(agent_paused_tasks.checkpointed_at) AS avg_1
FROM agent_paused_tasks
WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR;

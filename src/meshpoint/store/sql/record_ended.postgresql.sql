-- Records in the ledger of ended tasks that a task ended.
INSERT INTO agent_ended_tasks (
               tenant_id, logical_task_id, agent_name, ended_at)
SELECT :p_tenant::VARCHAR AS anon_1, :p_task::VARCHAR AS anon_2, :p_agent::VARCHAR AS anon_3,
  :p_now::FLOAT AS anon_4
WHERE NOT (EXISTS
             (SELECT 1 AS anon_5
              FROM agent_ended_tasks
              WHERE agent_ended_tasks.tenant_id = :p_tenant::VARCHAR
                AND agent_ended_tasks.logical_task_id = :p_task::VARCHAR));

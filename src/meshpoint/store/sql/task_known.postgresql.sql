-- Whether agent p_agent's task p_task is paused, or is remembered in the ledger of ended tasks.
SELECT (EXISTS
          (SELECT 1 AS anon_2
           FROM agent_paused_tasks
           WHERE agent_paused_tasks.tenant_id = :p_tenant::VARCHAR
             AND agent_paused_tasks.logical_task_id = :p_task::VARCHAR
             AND agent_paused_tasks.agent_name = :p_agent::VARCHAR))
OR (EXISTS
      (SELECT 1 AS anon_3
       FROM agent_ended_tasks
       WHERE agent_ended_tasks.tenant_id = :p_tenant::VARCHAR
         AND agent_ended_tasks.logical_task_id = :p_task::VARCHAR
         AND agent_ended_tasks.agent_name = :p_agent::VARCHAR)) AS anon_1;

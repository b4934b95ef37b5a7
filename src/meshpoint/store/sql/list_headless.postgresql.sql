-- Lists the tenant's tasks that have history records but no head (a head deleted: verify reports them), after a task id (paging).
SELECT DISTINCT agent_checkpoints.logical_task_id
FROM agent_checkpoints
WHERE agent_checkpoints.tenant_id = :p_tenant::VARCHAR
  AND agent_checkpoints.logical_task_id > :p_after::VARCHAR
  AND NOT (EXISTS
             (SELECT agent_checkpoint_heads.records
              FROM agent_checkpoint_heads
              WHERE agent_checkpoint_heads.tenant_id = agent_checkpoints.tenant_id
                AND agent_checkpoint_heads.logical_task_id = agent_checkpoints.logical_task_id))
ORDER BY agent_checkpoints.logical_task_id
LIMIT :p_limit::INTEGER;

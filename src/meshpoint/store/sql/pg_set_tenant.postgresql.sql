-- Sets the tenant of this transaction for the row-level security policies (for this transaction only).
SELECT set_config('meshpoint.tenant_id', :p_tenant::VARCHAR, true) AS set_config_1;

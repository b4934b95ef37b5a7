-- Serialises the moves of one task (until commit).
SELECT pg_advisory_xact_lock(hashtext(concat(
                                        :p_tenant::VARCHAR, '/move/', :p_task::VARCHAR))) AS pg_advisory_xact_lock_1;

-- Serialises the syncs of one source table (until commit).
SELECT pg_advisory_xact_lock(hashtext(concat(
                                        :p_tenant::VARCHAR, '/', :p_source::VARCHAR, '/',
                                        :p_table::VARCHAR))) AS pg_advisory_xact_lock_1;

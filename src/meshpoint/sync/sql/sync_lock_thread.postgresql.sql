-- Serialises the syncs of one LangGraph thread, from any source (until commit).
SELECT pg_advisory_xact_lock(hashtext(concat(
                                        :p_tenant::VARCHAR, '/langgraph/', :p_thread::VARCHAR))) AS pg_advisory_xact_lock_1;

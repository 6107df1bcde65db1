-- `drover_claims_paused` (migration 0026) compares the server's timeline with
-- the one `drover_observe_lineage` recorded. A role that may not call the
-- functions observe reads the identity with (`pg_control_system`,
-- `pg_walfile_name`, `pg_current_wal_lsn`: a hardened or managed server may
-- revoke them) broke two ways where another role (the one that migrated)
-- had recorded a timeline:
--   - without `pg_walfile_name`, every claim, gated claim and lock of that
--     role failed with "permission denied for function pg_walfile_name";
--   - without `pg_control_system`, its observe records nothing, so after a
--     promotion the timelines disagreed for ever: its claims paused until
--     some privileged connection came, possibly never.
-- The timeline is now compared only where the role could record it, as
-- observe does: otherwise the check is what it was before 0026 (the pause
-- alone), and such a role never notices a fork, as the README says of a
-- server that hides its identity. In PL/pgSQL: PostgreSQL checks the right
-- to call a function when it prepares the expression that calls it, so a
-- CASE around the call in one SQL statement does not keep it from failing;
-- PL/pgSQL prepares each statement only when it first runs it. It is also
-- cheaper than 0026's SQL function: about 5 us a call against 12 us (and
-- 0.8 us for 0025's read of the pause alone), 100,000 calls in a loop.
-- Written over an applied 0026, so its checksum stays as released.
CREATE OR REPLACE FUNCTION drover_claims_paused(at_ timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    seen drover_lineage;
BEGIN
    SELECT * INTO seen FROM drover_lineage;
    IF seen.paused_until > at_ THEN
        RETURN true;
    END IF;
    IF seen.timeline IS NULL OR pg_is_in_recovery()
       OR NOT has_function_privilege('pg_control_system()', 'EXECUTE')
       OR NOT has_function_privilege('pg_walfile_name(pg_lsn)', 'EXECUTE')
       OR NOT has_function_privilege('pg_current_wal_lsn()', 'EXECUTE') THEN
        RETURN false;
    END IF;
    RETURN seen.timeline
        <> ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END $$;

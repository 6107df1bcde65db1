-- No session id or fencing token of before a fork is handed out again
-- (DESIGN.md rules 1, 9 and 12). A sequence's values are written to the log
-- 32 at a time, when the first of them is handed out; with asynchronous
-- replication the standby may not have that record, so a promoted standby's
-- sequences can restart below what the old primary handed out. A session id
-- handed out again is the new worker's and the lost one's at once: the lost
-- worker's heartbeats on its old id renewed the new worker's session (rule
-- 12's expiry never reached it), so it kept running keys whose claims were
-- lost, past the pause, while they ran again elsewhere; and it could claim,
-- complete or close under the new worker's session (the owner check cannot
-- tell one token's two sessions apart). A fencing token handed out again put
-- the new primary's runs below the stale writer's, so a downstream system
-- keeping the highest token per key refused the new runs (rule 9
-- inverted). The fork now moves both sequences a billion past where the
-- promoted standby had them: more than any primary hands out within its
-- replication lag, and far within 2^53 (what a JSON client reads exactly)
-- for millions of forks.

CREATE OR REPLACE FUNCTION drover_observe_lineage(clock_offset_ms double precision)
RETURNS TABLE (forked boolean, paused_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    now_ timestamptz := clock_timestamp() + clock_offset_ms * interval '1 millisecond';
    sysid bigint;
    tli bigint;
    seen drover_lineage;
    longest double precision;
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN;
    END IF;
    BEGIN
        SELECT system_identifier INTO sysid FROM pg_control_system();
        -- The current WAL file's name starts with its timeline, in hex.
        tli := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    EXCEPTION WHEN insufficient_privilege OR undefined_function OR feature_not_supported THEN
        RETURN;
    END;
    -- The common case, a read: nothing changed.
    SELECT * INTO seen FROM drover_lineage;
    IF seen.system_identifier = sysid AND seen.timeline = tli THEN
        RETURN QUERY SELECT false, seen.paused_until;
        RETURN;
    END IF;
    -- First sight, or a fork: decide under the row's lock, so that of the
    -- connections that find it at once exactly one records it.
    INSERT INTO drover_lineage DEFAULT VALUES ON CONFLICT (only_row) DO NOTHING;
    SELECT * INTO seen FROM drover_lineage FOR UPDATE;
    IF seen.system_identifier = sysid AND seen.timeline = tli THEN
        RETURN QUERY SELECT false, seen.paused_until;
        RETURN;
    END IF;
    IF seen.system_identifier IS NULL THEN
        UPDATE drover_lineage SET system_identifier = sysid, timeline = tli;
        RETURN QUERY SELECT false, seen.paused_until;
        RETURN;
    END IF;
    SELECT greatest(max(s.ttl_ms)::double precision, seen.longest_ttl_ms, 0)
        INTO longest FROM drover_sessions s;
    UPDATE drover_sessions SET deadline = now_ WHERE deadline > now_;
    -- What the old primary handed out after the standby's last replayed
    -- record is unknown here, and so is how far its sequences had got: move
    -- them past anything it could have handed out, so no session id or
    -- fencing token of before the fork is handed out again.
    -- A role that may not set them (setval needs UPDATE on a sequence; an
    -- identity's nextval needs only INSERT on its table) notices the fork
    -- as before.
    BEGIN
        PERFORM setval(pg_get_serial_sequence('drover_sessions', 'id'),
            nextval(pg_get_serial_sequence('drover_sessions', 'id')) + 1000000000);
        PERFORM setval('drover_lease_tokens', nextval('drover_lease_tokens') + 1000000000);
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'drover: this role may not move the session and fencing token sequences past the fork';
    END;
    UPDATE drover_lineage SET system_identifier = sysid, timeline = tli, forked_at = now_,
        paused_until = now_ + longest * interval '1 millisecond';
    RETURN QUERY SELECT true, now_ + longest * interval '1 millisecond';
END
$$;

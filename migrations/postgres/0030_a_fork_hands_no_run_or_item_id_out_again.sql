-- No run id or item id of before a fork is handed out again either
-- (DESIGN.md rule 12; migration 0029 moved the session and fencing token
-- sequences only). A promoted standby's identity sequences can restart below
-- what the old primary handed out (a sequence is logged 32 values ahead, and
-- an asynchronous standby may lack that record). A run id is history's page
-- cursor and is documented as increasing in the order rows were written: a
-- caller holding `next_before` (API), `--before` (CLI) or an "older" link
-- (dashboard) from the old primary was shown runs that ended after the fork
-- as older than the page it had read, and a reader that follows history by
-- the highest id it has seen skipped the new runs whose ids it had already
-- passed. An item id is the FIFO tie-break and part of the triage page
-- cursor, which a link from before the fork carries. The fork now moves the
-- runs' and items' sequences a billion ahead too, in the same step. The item
-- count deltas' ids are left: no reader holds one outside a transaction.

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
    -- them past anything it could have handed out, so no session id,
    -- fencing token, run id or item id of before the fork is handed out
    -- again.
    -- A role that may not set them (setval needs UPDATE on a sequence; an
    -- identity's nextval needs only INSERT on its table) notices the fork
    -- as before.
    BEGIN
        PERFORM setval(pg_get_serial_sequence('drover_sessions', 'id'),
            nextval(pg_get_serial_sequence('drover_sessions', 'id')) + 1000000000);
        PERFORM setval('drover_lease_tokens', nextval('drover_lease_tokens') + 1000000000);
        PERFORM setval(pg_get_serial_sequence('drover_runs', 'id'),
            nextval(pg_get_serial_sequence('drover_runs', 'id')) + 1000000000);
        PERFORM setval(pg_get_serial_sequence('drover_items', 'id'),
            nextval(pg_get_serial_sequence('drover_items', 'id')) + 1000000000);
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'drover: this role may not move the session, fencing token, run and item sequences past the fork';
    END;
    UPDATE drover_lineage SET system_identifier = sysid, timeline = tli, forked_at = now_,
        paused_until = now_ + longest * interval '1 millisecond';
    RETURN QUERY SELECT true, now_ + longest * interval '1 millisecond';
END
$$;

-- Never twice at once across a promotion (DESIGN.md rule 12, issue 34).
--
-- A promoted standby starts a new timeline; a database restored elsewhere has
-- another system identifier. Either way its history forked: what the old
-- primary acknowledged after the standby's last replayed commit (with
-- asynchronous replication, a claim) is not there, so a key a worker still
-- runs may be pending here. `drover_lineage` records the identity drover
-- last saw; the first connection that finds another one (every new
-- connection of a store calls `drover_observe_lineage`, see
-- src/store/postgres/lineage.rs) expires every session of before the fork
-- and pauses claims for the longest of their TTLs: by then each earlier
-- worker has given its runs up by its own clock (rule 6), and their keys run
-- again (at least once, never twice at once).
CREATE TABLE drover_lineage (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    -- The identity drover last saw (NULL until the first connection looks).
    system_identifier bigint,
    timeline bigint,
    -- The longest TTL a session ever started with: the pause covers it even
    -- when that session's own row was lost with the fork.
    longest_ttl_ms double precision,
    -- When the last fork was noticed, on the database clock (NULL: none yet).
    forked_at timestamptz,
    -- No claim hands a key out before this (NULL: no pause).
    paused_until timestamptz
);
INSERT INTO drover_lineage (longest_ttl_ms) SELECT max(ttl_ms) FROM drover_sessions;

-- Records the server's identity, or notices that it changed. Returns no row
-- on a standby (nothing to record, nothing to pause there) or when the
-- identity cannot be read (a managed server that hides it: then no fork is
-- ever noticed); otherwise one row: whether this call noticed a fork, and the
-- end of the pause (NULL or past when claims are free).
CREATE FUNCTION drover_observe_lineage(clock_offset_ms double precision)
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
    UPDATE drover_lineage SET system_identifier = sysid, timeline = tli, forked_at = now_,
        paused_until = now_ + longest * interval '1 millisecond';
    RETURN QUERY SELECT true, now_ + longest * interval '1 millisecond';
END
$$;

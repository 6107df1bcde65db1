-- Claims check the server's timeline themselves (DESIGN.md rule 12).
--
-- The pause after a fork started only when a new connection, or the reclaim
-- every few seconds, called `drover_observe_lineage` (migration 0011). A
-- connection that outlived its server's promotion (one opened to the standby
-- while it was one, through a name that moved to it early; a pooler's client
-- connection whose server connections moved to the new primary) claimed
-- through it at once, before anything noticed the fork: a key the old
-- primary had leased, lost with it, was handed out while its worker still
-- ran it. `lease_lock` (a query source's path) did not read the pause at all.
--
-- `drover_claims_paused` is now the one test every claim, gated claim and
-- lock makes: paused while the pause lasts, and also while the server's
-- timeline is not the one drover recorded, which is from the promotion until
-- something observes the fork (the pause then runs a longest TTL from that
-- moment, later than from the promotion, so never shorter). The timeline is
-- the current write-ahead log file's, as `drover_observe_lineage` reads it:
-- memory, not the control file. The function takes about 12 us a call
-- against 2 us for the pause's read alone (100,000 calls in a loop), so
-- 10 us more per claim, against the 0.9 ms a claim costs. On
-- a standby it is not read (both functions fail in recovery; the claim's
-- write is refused there as before, read-only), nor when drover never
-- recorded a timeline (a server that hides it), so nothing changes there.
-- `drover_claim` is made again as migration 0025 left it, its `forked` step
-- asking this function.
CREATE FUNCTION drover_claims_paused(at_ timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM drover_lineage l
        WHERE l.paused_until > at_
           OR CASE WHEN l.timeline IS NULL OR pg_is_in_recovery() THEN false
                   ELSE l.timeline <> ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
              END)
$$;

CREATE OR REPLACE FUNCTION drover_claim(
    claim_session bigint,
    claim_process text,
    claim_max bigint,
    clock_offset_ms double precision,
    with_traces boolean)
RETURNS TABLE (
    live bigint,
    held bigint,
    process text,
    key text,
    priority integer,
    failures integer,
    enqueued_at timestamptz,
    lease_token bigint,
    started_at timestamptz,
    trace_run text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE clock AS (SELECT clock_timestamp() + clock_offset_ms * interval '1 millisecond' AS now),
    live AS (
      SELECT s.id FROM drover_sessions s
      WHERE s.id = claim_session AND s.deadline > (SELECT now FROM clock)),
    gate AS (
      SELECT 1 FROM drover_processes g
      WHERE g.process = claim_process
        AND (g.paused OR g.concurrency IS NOT NULL OR g.rate_per_s IS NOT NULL)),
    forked AS (
      SELECT 1 WHERE drover_claims_paused((SELECT now FROM clock))),
    prios AS (
      SELECT max(priority) AS p FROM drover_items
      WHERE process = claim_process AND state = 'pending' AND EXISTS (SELECT 1 FROM live)
        AND NOT EXISTS (SELECT 1 FROM gate) AND NOT EXISTS (SELECT 1 FROM forked)
      UNION ALL
      SELECT (SELECT max(priority) FROM drover_items
              WHERE process = claim_process AND state = 'pending' AND priority < prios.p)
      FROM prios WHERE prios.p IS NOT NULL),
    picked AS (
      SELECT r.key FROM prios CROSS JOIN LATERAL (
        SELECT i.key FROM drover_items i
        WHERE i.process = claim_process AND i.state = 'pending' AND i.priority = prios.p
          AND i.ready_at <= (SELECT now FROM clock)
        ORDER BY i.ready_at, i.id
        LIMIT claim_max
        FOR UPDATE OF i SKIP LOCKED) r
      WHERE prios.p IS NOT NULL
      LIMIT claim_max),
    claimed AS (
      UPDATE drover_items i SET state = 'running', lease_session = claim_session,
          lease_token = nextval('drover_lease_tokens'), started_at = (SELECT now FROM clock)
      WHERE i.process = claim_process AND i.key = ANY(ARRAY(SELECT key FROM picked))
      RETURNING i.id, i.process, i.key, i.priority, i.failures, i.ready_at, i.enqueued_at,
          i.lease_token, i.started_at, CASE WHEN with_traces THEN i.trace_run::text END AS trace_run)
    SELECT (SELECT count(*) FROM live) AS live, (SELECT count(*) FROM gate) AS held, c.process, c.key, c.priority, c.failures,
        c.enqueued_at, c.lease_token, c.started_at, c.trace_run
    FROM (SELECT 1) AS one LEFT JOIN claimed c ON true
    ORDER BY c.priority DESC, c.ready_at, c.id;
END $$;

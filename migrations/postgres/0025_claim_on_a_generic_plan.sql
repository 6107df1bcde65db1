-- The unlimited claim as a function whose statement runs on a generic plan
-- (issue 39: claims of a few keys).
--
-- The claim was a prepared statement that PostgreSQL planned afresh on every
-- call: its generic plan prices `LIMIT $3` at a tenth of the process's rows
-- (the planner cannot know the parameter), so it always looked dearer than a
-- custom plan and was never chosen, though its shape is the same (index scans
-- of the claim index, a primary-key probe per picked key; `plans.rs` checks
-- both). `pg_stat_statements` over a burn-down at 16 runs at once: 1,008
-- plans for 1,003 claims, 0.41 ms of planning against 0.51 ms of execution
-- per claim. The completions, planned generically by PostgreSQL's own choice
-- after five calls, paid 30 plans for 728 calls.
--
-- A session setting cannot force the generic plan for the claim alone (it
-- would also hold for every other statement on the connection, some of which
-- need their parameters' values to choose a partial index), and a
-- transaction-local one costs two round trips. A function's `SET` holds only
-- while it runs, and PL/pgSQL keeps its statement's plan for the session, as
-- `drover_claim_gated` has done since migration 0008.
--
-- The body is the claim as `src/store/postgres/leases.rs` ran it until now,
-- each `$n` given its name: check the session, walk the process's distinct
-- pending priorities from the highest down, take each priority's ready rows
-- in (ready time, id) order skipping rows other claimers hold, lease them
-- with fresh fencing tokens; `held` when the process is paused or limited
-- (the caller then claims through `drover_claim_gated`, whose claim is this
-- one without the gate: keep the two in step), nothing during the pause after
-- a fork in the database's history (`drover_lineage`). The rows come back in
-- claim order; the caller reads them `WITH ORDINALITY`.
CREATE FUNCTION drover_claim(
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
      SELECT 1 FROM drover_lineage WHERE paused_until > (SELECT now FROM clock)),
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

-- The running count a limited process's claim reads (migration 0016), in
-- PL/pgSQL so that its statement's plan is kept for the session: as a SQL
-- function it cannot be inlined into its caller (its body holds subqueries),
-- so PostgreSQL planned it on every call (1,505 plans for 1,505 limited claims
-- of a burn-down at 16 runs at once, 0.06 ms each, a fifth of what a limit
-- that does not bind added to a claim). Same statement, same snapshot
-- (`STABLE`: its caller's).
CREATE OR REPLACE FUNCTION drover_running_count(proc text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN COALESCE((SELECT n FROM drover_item_counts
                     WHERE process = proc AND state = 'running'), 0)
         + COALESCE((SELECT sum(delta) FROM drover_item_count_deltas
                     WHERE process = proc AND state = 'running'), 0)::bigint;
END $$;

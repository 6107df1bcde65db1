-- The claim of a paused or limited process (issue 15's fleet controls) in one
-- statement: `SELECT * FROM drover_claim_gated(session, process, max, offset)`
-- is one round trip and one commit, where the transaction it replaces (lock
-- the process row; read the clock and the running count; claim; store the
-- bucket; commit) took five.
--
-- What serialises two claims of a limited process is the process row's lock,
-- taken by the function's first statement. The running count is read by a
-- LATER statement: under READ COMMITTED a statement that waited on a row lock
-- re-checks only that row and keeps its old snapshot for every other row, so a
-- count in the locking statement could miss a claim that committed during the
-- wait and over-admit. A VOLATILE function (the default) "obtains a fresh
-- snapshot at the start of each query [it] executes" (PostgreSQL manual,
-- "Function Volatility Categories"; STABLE and IMMUTABLE ones keep the calling
-- query's), so the count, a statement of its own after the lock is held, sees
-- every claim that committed before it. tests/store_fleet.rs forces that
-- interleaving.
--
-- The admission follows `GateRow::admit` (src/store/gate.rs) exactly, with the
-- same floating-point steps: paused admits none; a concurrency limit admits
-- its free slots; a rate limit admits the whole tokens of the bucket refilled
-- at `rate_per_s` for the whole milliseconds since `rate_tokens_at` (none when
-- the clock went back), capped at the burst. The function returns the process
-- row as it read it (before the bucket's write), the clock and the running
-- count, so the store recomputes the admission with `GateRow::admit`, checks
-- that it agrees (debug builds) and builds the claimer's answer with
-- `GateRow::taken`: the gate's answer has one author.
--
-- The claim is the store's `CLAIM` statement (src/store/postgres/leases.rs)
-- without its gate; keep the two in step. A process that is no longer paused
-- or limited is claimed up to `max` and returned with `binds` false, so a
-- store that took the process for a limited one learns that it is not.
--
-- The function's statements run on generic plans (`plan_cache_mode`, set for
-- the call only): PL/pgSQL caches each statement's plan per connection, and
-- left to choose it re-plans the claim for every call (a custom plan costs
-- far less by the planner's estimate of a parameter `LIMIT`), which took about
-- as long as running it (0.7 ms of 1.5 ms for 16 keys). The generic plan has
-- the custom one's shape, checked with auto_explain: the process's pending
-- keys by the partial index `drover_items_claim` in (priority, ready time)
-- order under `LIMIT`, the update by `id = ANY(…)` on the primary key.
--
-- Returns one row per claimed key in claim order, or one row with NULL lease
-- columns when nothing was claimed; `live` false (and nothing claimed, the
-- bucket untouched) when the session is gone.
CREATE FUNCTION drover_claim_gated(
    claim_session bigint,
    claim_process text,
    claim_max bigint,
    clock_offset_ms double precision)
RETURNS TABLE (
    live boolean,
    binds boolean,
    paused boolean,
    concurrency integer,
    rate_per_s double precision,
    rate_burst integer,
    rate_tokens double precision,
    rate_tokens_at timestamptz,
    decided_at timestamptz,
    running bigint,
    allowed bigint,
    process text,
    key text,
    priority integer,
    failures integer,
    enqueued_at timestamptz,
    lease_token bigint,
    started_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    proc text := claim_process;
    g_paused boolean;
    g_concurrency integer;
    g_rate double precision;
    g_burst integer;
    g_tokens double precision;
    g_tokens_at timestamptz;
    is_binding boolean;
    now_at timestamptz;
    is_live boolean;
    n_running bigint;
    n_allowed bigint := GREATEST(claim_max, 0);
    tokens_now double precision;
    elapsed_ms double precision;
BEGIN
    -- 1. The lock: every later statement runs after it is held.
    SELECT p.paused, p.concurrency, p.rate_per_s, p.rate_burst, p.rate_tokens, p.rate_tokens_at
      INTO g_paused, g_concurrency, g_rate, g_burst, g_tokens, g_tokens_at
    FROM drover_processes p WHERE p.process = proc FOR UPDATE;
    is_binding := FOUND AND (g_paused OR g_concurrency IS NOT NULL OR g_rate IS NOT NULL);
    -- 2. A fresh snapshot: the clock, the session and the running count
    -- (counted only under a concurrency limit; the IN term names the partial
    -- index of running and parked keys).
    SELECT c.now, EXISTS (SELECT 1 FROM drover_sessions s
                          WHERE s.id = claim_session AND s.deadline > c.now),
           CASE WHEN is_binding AND NOT g_paused AND g_concurrency IS NOT NULL
                THEN (SELECT count(*) FROM drover_items i
                      WHERE i.process = proc AND i.state IN ('running', 'parked')
                          AND i.state = 'running')
                ELSE 0 END
      INTO now_at, is_live, n_running
    FROM (SELECT clock_timestamp() + clock_offset_ms * interval '1 millisecond' AS now) c;
    -- 3. The admission (`GateRow::admit`).
    IF is_binding AND g_paused THEN
        n_allowed := 0;
    ELSIF is_binding THEN
        IF g_concurrency IS NOT NULL THEN
            n_allowed := LEAST(n_allowed, GREATEST(g_concurrency - n_running, 0));
        END IF;
        IF g_rate IS NOT NULL THEN
            IF g_tokens IS NULL OR g_tokens_at IS NULL THEN
                tokens_now := GREATEST(g_burst, 1)::double precision;
            ELSE
                elapsed_ms := GREATEST(floor(extract(epoch FROM now_at - g_tokens_at) * 1000),
                                       0)::double precision;
                tokens_now := LEAST(g_tokens + elapsed_ms / 1000.0::double precision * g_rate,
                                    GREATEST(g_burst, 1)::double precision);
            END IF;
            n_allowed := LEAST(n_allowed,
                               GREATEST(floor(tokens_now + 1e-9::double precision), 0)::bigint);
        END IF;
    END IF;
    IF NOT is_live THEN
        n_allowed := 0;
    END IF;
    -- 4. The claim (`CLAIM` without its gate) and the bucket's new content
    -- (what it held now less what was taken, as of now), in one statement.
    RETURN QUERY
    WITH RECURSIVE prios AS (
      SELECT max(i.priority) AS p FROM drover_items i
      WHERE i.process = proc AND i.state = 'pending' AND n_allowed > 0
      UNION ALL
      SELECT (SELECT max(i.priority) FROM drover_items i
              WHERE i.process = proc AND i.state = 'pending' AND i.priority < prios.p)
      FROM prios WHERE prios.p IS NOT NULL),
    picked AS (
      SELECT r.id FROM prios CROSS JOIN LATERAL (
        SELECT i.id FROM drover_items i
        WHERE i.process = proc AND i.state = 'pending' AND i.priority = prios.p
          AND i.ready_at <= now_at
        ORDER BY i.ready_at, i.id
        LIMIT n_allowed
        FOR UPDATE OF i SKIP LOCKED) r
      WHERE prios.p IS NOT NULL
      LIMIT n_allowed),
    claimed AS (
      UPDATE drover_items i SET state = 'running', lease_session = claim_session,
          lease_token = nextval('drover_lease_tokens'), started_at = now_at
      WHERE i.id = ANY(ARRAY(SELECT id FROM picked))
      RETURNING i.id, i.process, i.key, i.priority, i.failures, i.ready_at, i.enqueued_at,
          i.lease_token, i.started_at),
    bucket AS (
      UPDATE drover_processes p
      SET rate_tokens = tokens_now - (SELECT count(*) FROM claimed), rate_tokens_at = now_at
      WHERE p.process = proc AND tokens_now IS NOT NULL AND EXISTS (SELECT 1 FROM claimed))
    SELECT is_live, is_binding, g_paused, g_concurrency, g_rate, g_burst, g_tokens, g_tokens_at,
        now_at, n_running, n_allowed,
        c.process, c.key, c.priority, c.failures, c.enqueued_at, c.lease_token, c.started_at
    FROM (SELECT 1) AS one LEFT JOIN claimed c ON true
    ORDER BY c.priority DESC, c.ready_at, c.id;
END $$;

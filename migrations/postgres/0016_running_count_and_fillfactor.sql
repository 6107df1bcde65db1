-- Two changes for issue 39's PostgreSQL burn-down: the concurrency gate reads
-- a process's running count from the item counts, and item pages keep room
-- for the next version of their rows.
--
-- 1. The running count.
--
-- The concurrency gate reads it from the item counts (migration 0007), as
-- SQLite's gate does, instead of counting running rows.
--
-- Since migration 0014 the running rows have one index, the lease index
-- `(lease_session, lease_token)`, which the workers page and reclaims need in
-- that order. Counting one process's running rows through it read every
-- running row of every process, one heap fetch each, on every claim of a
-- limited process (10,000 fetches per claim beside a fleet of 10,000 runs),
-- under the process lock that serialises that process's claims.
--
-- The counts are exact in any snapshot: the folded count and the deltas
-- appended since are written in the transactions that change the rows, and a
-- fold moves deltas into the count in one statement. A limited claim reads
-- the process's folded row and its deltas since the last fold (a few seconds
-- of statements, not keys) through a new index of the deltas by process;
-- the deltas are a row per statement and state, so the index costs a claim or
-- a completion one entry per batch, not per key.
CREATE INDEX drover_item_count_deltas_process ON drover_item_count_deltas (process, state);

-- The running count of process `proc` in the caller's snapshot.
CREATE FUNCTION drover_running_count(proc text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT n FROM drover_item_counts
                     WHERE process = proc AND state = 'running'), 0)
         + COALESCE((SELECT sum(delta) FROM drover_item_count_deltas
                     WHERE process = proc AND state = 'running'), 0)::bigint
$$;

-- `drover_claim_gated` as migration 0008 wrote it (with 0011's changes none:
-- it was not replaced since), its running count read by the function above.
CREATE OR REPLACE FUNCTION drover_claim_gated(
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
    -- (read only under a concurrency limit, from the item counts).
    SELECT c.now, EXISTS (SELECT 1 FROM drover_sessions s
                          WHERE s.id = claim_session AND s.deadline > c.now),
           CASE WHEN is_binding AND NOT g_paused AND g_concurrency IS NOT NULL
                THEN drover_running_count(proc)
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

-- 2. Room on each page for the rows' next versions.
--
-- A claim and a completion each write a new version of the key's row (not a
-- HOT update: `state` decides the partial indexes). When the new version
-- does not fit on the old one's page, PostgreSQL first marks the old version
-- locked, with a write-ahead-log record of its own, then writes the new one
-- on another page: measured on a 100,000-key burn-down, four row-lock records
-- per key where two are the claim's and the completion's own locks. Half-full
-- pages keep the next version beside the old one even when a claim takes
-- every row of a page at once (keys enqueued together are claimed together):
--
--   fillfactor          100    85    70    60    50
--   WAL records / key  14.3  13.8  13.3  12.9  12.5
--
-- The price is space: a table of idle keys takes about twice the pages (its
-- indexes are unchanged), for a table whose rows are each rewritten at least
-- twice per run. The setting applies to pages filled from now on;
-- `VACUUM FULL drover_items` rewrites the existing ones.
ALTER TABLE drover_items SET (fillfactor = 50);

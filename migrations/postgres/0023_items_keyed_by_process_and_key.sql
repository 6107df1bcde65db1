-- `drover_items` loses its index on `id`; `(process, key)` becomes its
-- primary key (issue 39's PostgreSQL burn-down).
--
-- A claim (to `running`) and a completion (back to idle or pending) each
-- write a new version of the key's row that is not a HOT update (`state`
-- decides the partial indexes), so each writes an entry into every index of
-- the table, the primary key on `id` included. Nothing needed that index:
-- the hot path finds a row by its key (the unique `(process, key)` index)
-- or, once it holds the row locked, by its `ctid`, which cannot move under a
-- lock (see `src/store/postgres/tid.rs`). Without it each key drained writes
-- two index entries fewer (one per claim, one per completion).
--
-- The `id` column and its sequence stay: `id` is the FIFO tie-break of the
-- pending, backoff and parked-errors indexes, and the error groups' first
-- key. No foreign key points at it (the runs keep `(process, key)`).
--
-- The unique constraint on `(process, key)` becomes the primary key, so the
-- table keeps one (for tools and logical replication's replica identity).
-- PostgreSQL cannot turn a unique constraint's index into a primary key's,
-- so the index is built again, once, here.
ALTER TABLE drover_items
    DROP CONSTRAINT drover_items_pkey,
    DROP CONSTRAINT drover_items_process_key_key,
    ADD CONSTRAINT drover_items_pkey PRIMARY KEY (process, key);

-- `drover_claim_gated` as migration 0016 wrote it, its claimed rows found by
-- key rather than by id: `picked` returns their keys and the update finds
-- them through the primary key (`process = proc AND key = ANY(…)`, one probe
-- each), where before it probed the index on `id`. Not by `ctid`: a row
-- `picked` locked after a concurrent update is a version this statement's
-- snapshot does not see, so a TID scan would miss it; the index finds the
-- version the snapshot sees and the update follows it to the locked one. The
-- function had no `search_path` setting to pin again; its
-- `plan_cache_mode` is set below as before.
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
      SELECT r.key FROM prios CROSS JOIN LATERAL (
        SELECT i.key FROM drover_items i
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
      WHERE i.process = proc AND i.key = ANY(ARRAY(SELECT key FROM picked))
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

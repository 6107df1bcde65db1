-- The SQL enqueue on PostgreSQL checks its delay and clock offset, as the
-- view on SQLite does (its migration 0025). `drover_enqueue` took any
-- `delay_ms` (and `clock_offset_ms`) that PostgreSQL could add to a time:
-- - a delay past 180 days, drover's longest (`backoff::MAX_DELAY`, to which
--   the Rust API clamps a delay and past which the HTTP API and SQLite's
--   view refuse one), was written as asked, so one statement meant one
--   thing on one engine and was refused on the other;
-- - a delay of about 260,000 years or more (8.3e15 ms; up to PostgreSQL's
--   last time, year 294276) wrote a ready time past the last one the store
--   can read (chrono's, year 262142): every read of the key panicked in the
--   reader ("`NaiveDateTime + TimeDelta` overflowed"), its own read, the
--   item list and the triage page; on a running key the dirty ready time
--   did the same to the completion of its run, so the run could never end.
--   A clock offset that far did it to every time of the key.
-- Both are now refused before anything is written, with one line naming
-- `drover_enqueue`, as the view's are:
--   delay_ms         at most 15552000000 (180 days); a negative one still
--                    means none, and NULL the default (none).
--   clock_offset_ms  from -10^15 to 10^15 (about 31,700 years either way;
--                    the store fills it with its test clock's offset, other
--                    programs leave it out).
-- The priority needs no check: an `integer` parameter is already an i32.
-- The function is replaced in place (same arguments), so the grants an
-- operator gave on it stay as they are. Its body is otherwise migration
-- 0022's, but for its time `now`, taken after the checks.
CREATE OR REPLACE FUNCTION drover_enqueue(
    process text,
    keys text[],
    priority integer DEFAULT 0,
    delay_ms bigint DEFAULT 0,
    bypass_backoff boolean DEFAULT false,
    clock_offset_ms bigint DEFAULT 0,
    context text DEFAULT NULL,
    OUT pending bigint,
    OUT dirty bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    offset_ms double precision := COALESCE(drover_enqueue.clock_offset_ms, 0);
    after_ms double precision := offset_ms + GREATEST(COALESCE(drover_enqueue.delay_ms, 0), 0);
    prio integer := COALESCE(drover_enqueue.priority, 0);
    bypass boolean := COALESCE(drover_enqueue.bypass_backoff, false);
    -- Set once the numbers are checked: a far offset fails to make it.
    now timestamptz;
    proc text := drover_enqueue.process;
BEGIN
    IF proc IS NULL OR proc = '' OR octet_length(proc) > 1024 THEN
        RAISE EXCEPTION 'drover_enqueue: invalid process name %', quote_nullable(left(proc, 64))
            USING ERRCODE = '22023', HINT = 'a process name is 1 to 1024 bytes';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(drover_enqueue.keys) AS k
               WHERE k IS NULL OR k = '' OR octet_length(k) > 1024) THEN
        RAISE EXCEPTION 'drover_enqueue: invalid key in %', left(drover_enqueue.keys::text, 64)
            USING ERRCODE = '22023', HINT = 'a key is 1 to 1024 bytes, never NULL';
    END IF;
    IF drover_enqueue.delay_ms > 15552000000 THEN
        RAISE EXCEPTION 'drover_enqueue: delay_ms is an integer of milliseconds, at most 15552000000 (180 days)'
            USING ERRCODE = '22023', HINT = 'a negative delay_ms means none';
    END IF;
    IF drover_enqueue.clock_offset_ms NOT BETWEEN -1000000000000000 AND 1000000000000000 THEN
        RAISE EXCEPTION 'drover_enqueue: clock_offset_ms is an integer of milliseconds from -10^15 to 10^15'
            USING ERRCODE = '22023', HINT = 'leave it out: it is the store''s test clock';
    END IF;
    now := clock_timestamp() + offset_ms * interval '1 millisecond';
    INSERT INTO drover_processes (process, created_at) VALUES (proc, now)
    ON CONFLICT (process) DO NOTHING;
    -- Existing rows may be locked by a completion and the upsert waits for
    -- them: the times it writes into them are read when it writes them
    -- (`clock_timestamp()`), not before the wait.
    WITH up AS (
    INSERT INTO drover_items AS i (process, key, state, priority, ready_at, enqueued_at,
        first_enqueued_at, last_enqueued_at, enqueue_count)
    SELECT proc, k, 'pending', prio, now + (after_ms - offset_ms) * interval '1 millisecond',
        now, now, now, 1
    FROM (SELECT DISTINCT k COLLATE "C" AS k FROM unnest(drover_enqueue.keys) AS k ORDER BY 1) AS ks
    ON CONFLICT (process, key) DO UPDATE SET
      priority = CASE i.state WHEN 'pending' THEN GREATEST(i.priority, EXCLUDED.priority)
                              WHEN 'running' THEN i.priority ELSE EXCLUDED.priority END,
      ready_at = CASE i.state
          WHEN 'pending' THEN LEAST(i.ready_at, CASE
              WHEN bypass THEN clock_timestamp() + after_ms * interval '1 millisecond'
              ELSE GREATEST(clock_timestamp() + after_ms * interval '1 millisecond',
                            i.backoff_until) END)
          WHEN 'running' THEN i.ready_at
          ELSE clock_timestamp() + after_ms * interval '1 millisecond' END,
      enqueued_at = CASE i.state WHEN 'pending' THEN i.enqueued_at
          WHEN 'running' THEN i.enqueued_at
          ELSE clock_timestamp() + offset_ms * interval '1 millisecond' END,
      backoff_until = CASE WHEN bypass AND i.state = 'pending' THEN NULL
                           ELSE i.backoff_until END,
      dirty_since = CASE i.state
          WHEN 'running' THEN COALESCE(i.dirty_since,
                                       clock_timestamp() + offset_ms * interval '1 millisecond')
          ELSE i.dirty_since END,
      dirty_ready_at = CASE i.state
          WHEN 'running' THEN LEAST(i.dirty_ready_at,
                                    clock_timestamp() + after_ms * interval '1 millisecond')
          ELSE i.dirty_ready_at END,
      dirty_priority = CASE i.state WHEN 'running'
          THEN GREATEST(i.dirty_priority, EXCLUDED.priority) ELSE i.dirty_priority END,
      first_enqueued_at = COALESCE(i.first_enqueued_at,
                                   clock_timestamp() + offset_ms * interval '1 millisecond'),
      last_enqueued_at = clock_timestamp() + offset_ms * interval '1 millisecond',
      enqueue_count = i.enqueue_count + 1,
      state = CASE i.state WHEN 'running' THEN 'running' ELSE 'pending' END
    RETURNING i.state)
    SELECT count(*) FILTER (WHERE up.state = 'running'), count(*) INTO dirty, pending FROM up;
    pending := pending - dirty;
    IF pending + dirty > 0 THEN
        PERFORM pg_notify(drover_channel(proc), '');
    END IF;
    IF drover_enqueue.context IS NOT NULL THEN
        PERFORM drover_trace_link(proc, drover_enqueue.keys, drover_enqueue.context);
    END IF;
END $$;

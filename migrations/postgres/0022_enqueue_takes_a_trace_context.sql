-- The SQL enqueue takes an optional trace context (issue 38: "the SQL
-- enqueue accepts an optional context argument"):
--
--     SELECT drover_enqueue('provision', ARRAY['m-42'],
--                           context => '00-<trace id>-<span id>-01');
--
-- links the context to the keys' next run in the same call, as calling
-- `drover_trace_link` after `drover_enqueue` does (which still works), with
-- the same check (migration 0020: a context that is not W3C is left out
-- with a WARNING, and the keys stay enqueued) and the same cap.
--
-- A parameter cannot be added to a function in place, and a second
-- `drover_enqueue` with one more defaulted parameter would make every call
-- of the old form ambiguous; renamed, the old body's parameters (qualified
-- by the function's name) would no longer resolve. So the function of
-- migration 0006 is made again with `context` last, its body unchanged
-- but for the link at its end. Calls of the old form (the store's, the
-- watch triggers', other programs') resolve to it as before.
--
-- Dropping a function drops the privileges granted on it: an operator who
-- revoked EXECUTE from PUBLIC and granted it to the writers' roles gets the
-- same grants on the new function (saved before the drop, given back
-- after the create), not a function everyone may call again.
CREATE TEMPORARY TABLE drover_enqueue_acl ON COMMIT DROP AS
SELECT proacl FROM pg_proc
WHERE oid = 'drover_enqueue(text, text[], integer, bigint, boolean, bigint)'::regprocedure;

DROP FUNCTION drover_enqueue(text, text[], integer, bigint, boolean, bigint);

CREATE FUNCTION drover_enqueue(
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
    now timestamptz := clock_timestamp() + offset_ms * interval '1 millisecond';
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

-- The old function's grants, when it had any of its own (NULL: the
-- defaults, PUBLIC may execute, as it may the new one).
DO $$
DECLARE
    acl aclitem[] := (SELECT proacl FROM drover_enqueue_acl);
    fn text := 'drover_enqueue(text, text[], integer, bigint, boolean, bigint, text)';
    item record;
BEGIN
    IF acl IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
    FOR item IN SELECT grantee, is_grantable FROM aclexplode(acl)
                WHERE privilege_type = 'EXECUTE' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', fn,
                       CASE WHEN item.grantee = 0 THEN 'PUBLIC'
                            ELSE item.grantee::regrole::text END,
                       CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

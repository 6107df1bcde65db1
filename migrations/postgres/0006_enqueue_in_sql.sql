-- Enqueue where the change happens (issue 16): the enqueue as SQL functions,
-- so a program in any language can enqueue inside its own transaction, and
-- triggers can enqueue the keys of a watched table's rows.
--
-- `drover_enqueue` is THE enqueue: the store's own enqueue calls it too (all
-- but the bulk copy of keys that are all new), so the store's contract suite
-- tests what other programs call.

-- The NOTIFY channel of a process, as `PostgresStore::notify_channel` names
-- it: `drover_` + the name when it is a short lower-case identifier, else
-- `drover_` + the 64-bit FNV-1a hash of its UTF-8 bytes in hex (computed in
-- numeric, as bigint arithmetic cannot wrap).
CREATE FUNCTION drover_channel(process text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    bytes bytea := convert_to(process, 'UTF8');
    h numeric := 14695981039346656037;
    low integer;
BEGIN
    IF octet_length(bytes) <= 48 AND process ~ '^[a-z0-9_]*$' THEN
        RETURN 'drover_' || process;
    END IF;
    FOR i IN 0 .. octet_length(bytes) - 1 LOOP
        low := (h % 256)::integer;
        h := h - low + (low # get_byte(bytes, i));
        h := (h * 1099511628211) % 18446744073709551616;
    END LOOP;
    RETURN 'drover_'
        || lpad(to_hex(trunc(h / 4294967296)::bigint), 8, '0')
        || lpad(to_hex((h % 4294967296)::bigint), 8, '0');
END $$;

-- Enqueues `keys` to `process` in the caller's transaction, with DESIGN.md
-- rule 2: a pending key keeps the earlier ready time (never earlier than its
-- backoff unless `bypass_backoff`, which also clears the backoff) and the
-- higher priority; a parked or idle key becomes pending; a running key is
-- marked dirty (it runs exactly once more), remembering the earliest ready
-- time and highest priority. Every key counts the enqueue. Keys are written in
-- byte order, as completions lock rows, so concurrent writers never deadlock.
--
-- The workers' NOTIFY is queued in the same transaction: PostgreSQL delivers
-- it only if the transaction commits. `clock_offset_ms` is the store's test
-- clock shift (0 outside tests). Returns the keys now pending and those that
-- were running (now dirty).
CREATE FUNCTION drover_enqueue(
    process text,
    keys text[],
    priority integer DEFAULT 0,
    delay_ms bigint DEFAULT 0,
    bypass_backoff boolean DEFAULT false,
    clock_offset_ms bigint DEFAULT 0,
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
END $$;

-- Which tables are watched: each insert, update and delete of a row of
-- `relation` enqueues the row's `key_column` (old and new value) to
-- `process`, by the trigger `drover_watch` on that table. `columns`: when set,
-- an update that changes none of them enqueues nothing.
CREATE TABLE drover_watches (
    relation   TEXT PRIMARY KEY,
    process    TEXT   NOT NULL,
    key_column TEXT   NOT NULL,
    columns    TEXT[],
    created_at TIMESTAMPTZ NOT NULL
);

-- The trigger function of every watched table: TG_ARGV[0] is the process,
-- TG_ARGV[1] the key column. A NULL key enqueues nothing; an update that moves
-- the key enqueues both, so the old key's controller sees its object gone.
CREATE FUNCTION drover_watch_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_key text;
    new_key text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        old_key := to_jsonb(OLD) ->> TG_ARGV[1];
    END IF;
    IF TG_OP <> 'DELETE' THEN
        new_key := to_jsonb(NEW) ->> TG_ARGV[1];
    END IF;
    PERFORM drover_enqueue(TG_ARGV[0],
        ARRAY(SELECT DISTINCT k FROM unnest(ARRAY[old_key, new_key]) AS k WHERE k IS NOT NULL));
    RETURN NULL;
END $$;

-- Watches `relation` (a table name as SQL writes it: `machines`,
-- `public.machines`, `"Odd ""name"""`) for `process`, keyed by the column
-- named exactly `key_column`; `columns`, when given, filters updates. Installs
-- nothing and raises one clear error for an unknown table or column, a key
-- column of a type drover does not take as a key, or a table already watched.
CREATE FUNCTION drover_watch(relation text, process text, key_column text,
    columns text[] DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    rel regclass := to_regclass(drover_watch.relation);
    rel_name text;
    key_type regtype;
    missing text;
    changed text;
BEGIN
    IF drover_watch.process IS NULL OR drover_watch.process = ''
            OR octet_length(drover_watch.process) > 1024 THEN
        RAISE EXCEPTION 'invalid process name %', quote_nullable(drover_watch.process)
            USING ERRCODE = '22023';
    END IF;
    IF rel IS NULL OR NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = rel
                                   AND c.relkind IN ('r', 'p')) THEN
        RAISE EXCEPTION 'no table %: name an existing table (schema-qualified if it is not on the search path)',
            drover_watch.relation USING ERRCODE = '42P01';
    END IF;
    SELECT format('%I.%I', n.nspname, c.relname) INTO rel_name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = rel AND c.relname LIKE 'drover\_%') THEN
        RAISE EXCEPTION 'table % is one of drover''s own: watch a table of yours', rel_name
            USING ERRCODE = '42809';
    END IF;
    SELECT a.atttypid::regtype INTO key_type FROM pg_attribute a
    WHERE a.attrelid = rel AND a.attname = drover_watch.key_column
        AND a.attnum > 0 AND NOT a.attisdropped;
    IF key_type IS NULL THEN
        RAISE EXCEPTION 'table % has no column %', rel_name, quote_ident(drover_watch.key_column)
            USING ERRCODE = '42703';
    END IF;
    IF key_type NOT IN ('text'::regtype, 'character varying'::regtype, 'character'::regtype,
                        'smallint'::regtype, 'integer'::regtype, 'bigint'::regtype,
                        'uuid'::regtype) THEN
        RAISE EXCEPTION 'key column % of % has type %: use a text, varchar, char, smallint, integer, bigint or uuid column',
            quote_ident(drover_watch.key_column), rel_name, key_type USING ERRCODE = '42804';
    END IF;
    SELECT string_agg(quote_ident(c), ', ') INTO missing FROM unnest(drover_watch.columns) AS c
    WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = c
                          AND a.attnum > 0 AND NOT a.attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'table % has no column %', rel_name, missing USING ERRCODE = '42703';
    END IF;
    IF EXISTS (SELECT 1 FROM drover_watches w WHERE w.relation = rel_name)
            OR EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel
                           AND t.tgname = 'drover_watch') THEN
        RAISE EXCEPTION 'table % is already watched: run drover unwatch first', rel_name
            USING ERRCODE = '42710';
    END IF;
    SELECT string_agg(format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', c), ' OR ') INTO changed
    FROM unnest(drover_watch.columns) AS c;
    EXECUTE format('CREATE TRIGGER drover_watch AFTER INSERT OR DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION drover_watch_row(%L, %L)',
                   rel_name, drover_watch.process, drover_watch.key_column);
    EXECUTE format('CREATE TRIGGER drover_watch_update AFTER UPDATE ON %s FOR EACH ROW %s '
                   'EXECUTE FUNCTION drover_watch_row(%L, %L)',
                   rel_name, CASE WHEN changed IS NULL THEN '' ELSE 'WHEN (' || changed || ')' END,
                   drover_watch.process, drover_watch.key_column);
    INSERT INTO drover_watches (relation, process, key_column, columns, created_at)
    VALUES (rel_name, drover_watch.process, drover_watch.key_column,
            NULLIF(drover_watch.columns, '{}'), clock_timestamp());
    RETURN rel_name;
END $$;

-- Stops watching `relation`: drops its triggers and its record. Returns the
-- table's name, or NULL when it was not watched.
CREATE FUNCTION drover_unwatch(relation text) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    rel regclass := to_regclass(drover_unwatch.relation);
    rel_name text;
BEGIN
    IF rel IS NULL THEN
        -- The table is gone, and its triggers with it; forget the record.
        DELETE FROM drover_watches w WHERE w.relation = drover_unwatch.relation
        RETURNING w.relation INTO rel_name;
        RETURN rel_name;
    END IF;
    SELECT format('%I.%I', n.nspname, c.relname) INTO rel_name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
    IF NOT EXISTS (SELECT 1 FROM drover_watches w WHERE w.relation = rel_name) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch ON %s', rel_name);
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_update ON %s', rel_name);
    DELETE FROM drover_watches w WHERE w.relation = rel_name;
    RETURN rel_name;
END $$;

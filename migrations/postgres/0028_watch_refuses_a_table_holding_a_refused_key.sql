-- A table that already holds a key drover refuses (empty, or over 1,024
-- bytes) is refused a watch. Watched, every later change of such a row
-- failed, its DELETE too, with "drover_enqueue: invalid key": the owner could
-- not even remove the row without unwatching first. SQLite's table_watch
-- checks the same (session 42). A key column of type character(n) with n over
-- 1,024 is refused too: its keys are padded to n characters, so every change
-- of the table would fail.

-- Raises, in one line, if the watch of `rel` (named `rel_name`) by
-- `key_column` would enqueue a key drover refuses for a row it holds now.
CREATE FUNCTION drover_watch_check_keys(rel regclass, rel_name text, key_column text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    key_type regtype;
    width integer;
    refused text;
BEGIN
    SELECT a.atttypid::regtype, a.atttypmod INTO key_type, width FROM pg_attribute a
    WHERE a.attrelid = rel AND a.attname = drover_watch_check_keys.key_column
        AND a.attnum > 0 AND NOT a.attisdropped;
    -- Integers and uuids are never empty nor long; only text can be.
    IF key_type NOT IN ('text'::regtype, 'character varying'::regtype,
                        'character'::regtype) THEN
        RETURN;
    END IF;
    IF key_type = 'character'::regtype AND width - 4 > 1024 THEN
        RAISE EXCEPTION 'key column % of % is character(%): its keys are padded past 1,024 bytes, so every change would fail; use a text or varchar column',
            quote_ident(key_column), rel_name, width - 4 USING ERRCODE = '42804';
    END IF;
    -- The key exactly as the triggers read it (to_jsonb keeps char padding).
    EXECUTE format('SELECT k FROM (SELECT to_jsonb(t.%I) #>> ''{}'' AS k FROM %s AS t) AS s '
                   'WHERE k = '''' OR octet_length(k) > 1024 LIMIT 1',
                   key_column, rel_name) INTO refused;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'table % holds a row whose key % drover refuses (%: a key is 1 to 1,024 bytes of UTF-8 text without NUL); watched, its changes would fail: fix or delete such rows, then watch',
            rel_name, quote_ident(key_column),
            CASE WHEN refused = '' THEN 'empty'
                 ELSE format('%s bytes, %s…', octet_length(refused), quote_literal(left(refused, 40)))
            END
            USING ERRCODE = '22023';
    END IF;
END $$;

-- drover_watch as migration 0013 made it, with the keys checked before the
-- install.
CREATE OR REPLACE FUNCTION drover_watch(relation text, process text, key_column text,
    columns text[] DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    rel regclass := to_regclass(drover_watch.relation);
    rel_name text;
    key_type regtype;
    missing text;
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
    DELETE FROM drover_watches w
    WHERE (w.relid = rel OR w.relation = rel_name)
        AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = w.relid
                            AND t.tgname = 'drover_watch');
    IF EXISTS (SELECT 1 FROM drover_watches w WHERE w.relid = rel)
            OR EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel
                           AND t.tgname = 'drover_watch') THEN
        RAISE EXCEPTION 'table % is already watched: run drover unwatch first', rel_name
            USING ERRCODE = '42710';
    END IF;
    PERFORM drover_watch_check_keys(rel, rel_name, drover_watch.key_column);
    PERFORM drover_watch_install(rel_name, drover_watch.process, drover_watch.key_column,
                                 drover_watch.columns);
    INSERT INTO drover_watches (relation, relid, process, key_column, columns, created_at)
    VALUES (rel_name, rel, drover_watch.process, drover_watch.key_column,
            NULLIF(drover_watch.columns, '{}'), clock_timestamp());
    RETURN rel_name;
END $$;

-- drover_watch holds its table from its checks to its commit. It checked,
-- then installed the triggers, whose CREATE TRIGGER took the table's SHARE
-- ROW EXCLUSIVE lock only then:
-- - two nodes watching one table at once (each making sure of its watch as
--   it starts) both found it unwatched; the second then waited for the
--   first's lock and failed with PostgreSQL's 'trigger "drover_watch" for
--   relation … already exists' (or, had it got as far, a unique violation
--   of drover_watches), not with "already watched";
-- - a row with a key drover refuses, written by a transaction still open
--   while the keys were checked, was not seen by the check; the install
--   then waited for that writer and watched the table with the row in it,
--   whose every change, its DELETE too, then failed (what migration 0028
--   refuses a watch for).
-- It now takes that same lock (the one CREATE TRIGGER takes, which lets
-- readers through and waits for writers) before it looks for a watch of the
-- table and before it checks the keys. Otherwise it is migration 0028's.

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
    -- Held until the commit: the checks below and the install see the same
    -- table, and a second watch of it waits here, then finds this one.
    EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', rel_name);
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

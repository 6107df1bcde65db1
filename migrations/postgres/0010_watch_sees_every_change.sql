-- A watched table's every change is seen (DESIGN rule 11; issue 35):
-- - an update that moves the key enqueues the old and the new key even when
--   `columns` filters updates (the update trigger's WHEN named only the filter
--   columns, so a key change outside them enqueued nothing);
-- - TRUNCATE enqueues every key the table held (a statement trigger before
--   the truncate; row triggers never fire for it).
-- Watches made before this migration are upgraded in place.

-- Before a TRUNCATE of a watched table: every key it holds, to its process.
-- TG_ARGV as drover_watch_row's: the process, then the key column.
CREATE FUNCTION drover_watch_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    keys text[];
BEGIN
    EXECUTE format('SELECT array_agg(DISTINCT to_jsonb(t) ->> %L) FROM %I.%I AS t '
                   'WHERE to_jsonb(t) ->> %L IS NOT NULL',
                   TG_ARGV[1], TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[1]) INTO keys;
    IF keys IS NOT NULL THEN
        PERFORM drover_enqueue(TG_ARGV[0], keys);
    END IF;
    RETURN NULL;
END $$;

-- (Re)installs the triggers of the watch of `rel_name` (as drover_watches
-- names it): rows inserted and deleted; rows updated when the key or one of
-- `columns` (all columns when none) changed; the table truncated.
CREATE FUNCTION drover_watch_install(rel_name text, process text, key_column text,
    columns text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    changed text;
BEGIN
    IF columns IS NOT NULL AND cardinality(columns) > 0 THEN
        SELECT string_agg(format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', c), ' OR ') INTO changed
        FROM unnest(array_prepend(key_column, columns)) AS c;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch ON %s', rel_name);
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_update ON %s', rel_name);
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_truncate ON %s', rel_name);
    EXECUTE format('CREATE TRIGGER drover_watch AFTER INSERT OR DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION drover_watch_row(%L, %L)',
                   rel_name, process, key_column);
    EXECUTE format('CREATE TRIGGER drover_watch_update AFTER UPDATE ON %s FOR EACH ROW %s '
                   'EXECUTE FUNCTION drover_watch_row(%L, %L)',
                   rel_name, CASE WHEN changed IS NULL THEN '' ELSE 'WHEN (' || changed || ')' END,
                   process, key_column);
    EXECUTE format('CREATE TRIGGER drover_watch_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION drover_watch_truncate(%L, %L)',
                   rel_name, process, key_column);
END $$;

-- drover_watch as migration 0006 made it, its triggers now installed by
-- drover_watch_install.
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
    IF EXISTS (SELECT 1 FROM drover_watches w WHERE w.relation = rel_name)
            OR EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel
                           AND t.tgname = 'drover_watch') THEN
        RAISE EXCEPTION 'table % is already watched: run drover unwatch first', rel_name
            USING ERRCODE = '42710';
    END IF;
    PERFORM drover_watch_install(rel_name, drover_watch.process, drover_watch.key_column,
                                 drover_watch.columns);
    INSERT INTO drover_watches (relation, process, key_column, columns, created_at)
    VALUES (rel_name, drover_watch.process, drover_watch.key_column,
            NULLIF(drover_watch.columns, '{}'), clock_timestamp());
    RETURN rel_name;
END $$;

-- drover_unwatch as migration 0006 made it, dropping the truncate trigger too.
CREATE OR REPLACE FUNCTION drover_unwatch(relation text) RETURNS text
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
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_truncate ON %s', rel_name);
    DELETE FROM drover_watches w WHERE w.relation = rel_name;
    RETURN rel_name;
END $$;

-- Upgrade the watches made before: their tables still exist under the name
-- recorded (a renamed or dropped table is skipped, as unwatch would treat it).
DO $$
DECLARE
    w record;
BEGIN
    FOR w IN SELECT relation, process, key_column, columns FROM drover_watches LOOP
        IF to_regclass(w.relation) IS NOT NULL THEN
            PERFORM drover_watch_install(w.relation, w.process, w.key_column, w.columns);
        END IF;
    END LOOP;
END $$;

-- The trigger functions run in the writer's session, whose search_path need
-- not name drover's schema (the writer's change then failed) and could name a
-- schema with a drover_enqueue of its own (which would then run): they
-- resolve drover's names in the schema drover was migrated into, whatever the
-- writer's path.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION drover_watch_row() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION drover_watch_truncate() SET search_path = %I, pg_temp',
                   current_schema());
END $$;

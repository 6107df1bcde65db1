-- A watch follows its table through renames, and a watch whose key column is
-- gone fails the writer's change instead of enqueueing nothing (issue 35):
-- - drover_watches gains `relid`, the table's oid. A watch was found by the
--   name recorded when it was made, but ALTER TABLE … RENAME keeps the
--   triggers on the table and not its recorded name: unwatch found nothing
--   under either name, so the triggers could no longer be removed, and watch
--   of the new name said "already watched". Watch, unwatch and the listing
--   now go by the oid, and the listing shows the table's current name.
--   `relation` keeps the name the table was watched under (it is only used
--   once the table is dropped), so it is no longer the key: a new table may
--   take a renamed one's old name and be watched too. A record is live while
--   its table carries the trigger `drover_watch`; a dropped table takes its
--   triggers along, and a new table that reuses the oid has none.
-- - the row and truncate triggers read the key by name from their arguments,
--   which RENAME COLUMN does not rewrite: after a rename (or a drop) of the
--   key column every change enqueued nothing, silently. They now raise,
--   naming the table and what to do, so the writer's statement fails.

ALTER TABLE drover_watches ADD COLUMN relid oid;
ALTER TABLE drover_watches DROP CONSTRAINT drover_watches_pkey;
CREATE UNIQUE INDEX drover_watches_relid ON drover_watches (relid);

-- Existing watches: the table of the recorded name, when it carries this
-- installation's trigger.
UPDATE drover_watches w SET relid = to_regclass(w.relation)
WHERE EXISTS (SELECT 1 FROM pg_trigger t
              WHERE t.tgrelid = to_regclass(w.relation) AND t.tgname = 'drover_watch'
                AND t.tgfoid = 'drover_watch_row'::regproc);

-- A table renamed before this migration: the one table that carries this
-- installation's trigger with the watch's process and key column as its
-- arguments and has no record, when exactly one unresolved watch has them.
-- Any other unresolved watch's table is gone; its record stays, under the
-- name it was watched under, until drover unwatch names it.
UPDATE drover_watches w SET relid = t.tgrelid
FROM pg_trigger t
WHERE w.relid IS NULL AND t.tgname = 'drover_watch' AND t.tgfoid = 'drover_watch_row'::regproc
    AND t.tgargs = convert_to(w.process, getdatabaseencoding()) || '\x00'::bytea
                   || convert_to(w.key_column, getdatabaseencoding()) || '\x00'::bytea
    AND NOT EXISTS (SELECT 1 FROM drover_watches o WHERE o.relid = t.tgrelid)
    AND (SELECT count(*) FROM pg_trigger u
         WHERE u.tgname = 'drover_watch' AND u.tgfoid = t.tgfoid AND u.tgargs = t.tgargs
             AND NOT EXISTS (SELECT 1 FROM drover_watches o WHERE o.relid = u.tgrelid)) = 1
    AND (SELECT count(*) FROM drover_watches v
         WHERE v.relid IS NULL AND v.process = w.process AND v.key_column = w.key_column) = 1;

-- The trigger function of every watched table, as migration 0006 made it,
-- raising when the key column (TG_ARGV[1]) is not in the row.
CREATE OR REPLACE FUNCTION drover_watch_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_row jsonb;
    new_row jsonb;
    rel_name text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        old_row := to_jsonb(OLD);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        new_row := to_jsonb(NEW);
    END IF;
    IF NOT COALESCE(new_row, old_row) ? TG_ARGV[1] THEN
        rel_name := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
        RAISE EXCEPTION 'drover watch of %: key column "%" is gone (renamed or dropped); run drover unwatch %, then watch it again',
            rel_name, replace(TG_ARGV[1], '"', '""'), rel_name USING ERRCODE = '42703';
    END IF;
    PERFORM drover_enqueue(TG_ARGV[0],
        ARRAY(SELECT DISTINCT k FROM unnest(ARRAY[old_row ->> TG_ARGV[1], new_row ->> TG_ARGV[1]]) AS k
              WHERE k IS NOT NULL));
    RETURN NULL;
END $$;

-- drover_watch_truncate as migration 0010 made it, raising as drover_watch_row
-- does when the key column is gone.
CREATE OR REPLACE FUNCTION drover_watch_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    keys text[];
    rel_name text := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = TG_RELID
                   AND a.attname = TG_ARGV[1] AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'drover watch of %: key column "%" is gone (renamed or dropped); run drover unwatch %, then watch it again',
            rel_name, replace(TG_ARGV[1], '"', '""'), rel_name USING ERRCODE = '42703';
    END IF;
    EXECUTE format('SELECT array_agg(DISTINCT to_jsonb(t) ->> %L) FROM %I.%I AS t '
                   'WHERE to_jsonb(t) ->> %L IS NOT NULL',
                   TG_ARGV[1], TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[1]) INTO keys;
    IF keys IS NOT NULL THEN
        PERFORM drover_enqueue(TG_ARGV[0], keys);
    END IF;
    RETURN NULL;
END $$;

-- drover_watch as migration 0010 made it, finding and recording the watch by
-- the table's oid. Records this table left behind that are no longer live
-- (its oid's or its name's, whose table was dropped) are forgotten first.
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
    PERFORM drover_watch_install(rel_name, drover_watch.process, drover_watch.key_column,
                                 drover_watch.columns);
    INSERT INTO drover_watches (relation, relid, process, key_column, columns, created_at)
    VALUES (rel_name, rel, drover_watch.process, drover_watch.key_column,
            NULLIF(drover_watch.columns, '{}'), clock_timestamp());
    RETURN rel_name;
END $$;

-- drover_unwatch as migration 0010 made it, finding the watch by the table's
-- oid: `relation` names the table as it is now. A table that carries this
-- installation's trigger without a record (renamed before migration 0013 and
-- not matched then) has its triggers dropped too. A name that is no table
-- forgets the records watched under that name whose tables are gone.
CREATE OR REPLACE FUNCTION drover_unwatch(relation text) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    rel regclass := to_regclass(drover_unwatch.relation);
    rel_name text;
BEGIN
    IF rel IS NULL THEN
        WITH gone AS (
            DELETE FROM drover_watches w
            WHERE w.relation = drover_unwatch.relation
                AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = w.relid
                                    AND t.tgname = 'drover_watch')
            RETURNING w.relation)
        SELECT min(gone.relation) INTO rel_name FROM gone;
        RETURN rel_name;
    END IF;
    SELECT format('%I.%I', n.nspname, c.relname) INTO rel_name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
    IF NOT EXISTS (SELECT 1 FROM drover_watches w WHERE w.relid = rel
                       OR (w.relation = rel_name
                           AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = w.relid
                                               AND t.tgname = 'drover_watch')))
            AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel
                                AND t.tgname = 'drover_watch'
                                AND t.tgfoid = 'drover_watch_row'::regproc) THEN
        RETURN NULL;
    END IF;
    DELETE FROM drover_watches w
    WHERE w.relid = rel
        OR (w.relation = rel_name
            AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = w.relid
                                AND t.tgname = 'drover_watch'));
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch ON %s', rel_name);
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_update ON %s', rel_name);
    EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_truncate ON %s', rel_name);
    RETURN rel_name;
END $$;

-- CREATE OR REPLACE reset the trigger functions' settings: pin their
-- search_path again, as migration 0010 did and for its reasons.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION drover_watch_row() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION drover_watch_truncate() SET search_path = %I, pg_temp',
                   current_schema());
END $$;

-- A filtered watch compares its columns as written, not by their equality
-- operator. Its update trigger fired `WHEN (OLD.c IS DISTINCT FROM NEW.c …)`
-- for the key and each filter column, which compares by the column's type
-- and collation:
-- - under a nondeterministic collation (a case-insensitive ICU one), a key
--   that moved by its case only ('M1' to 'm1') or a filtered column changed
--   in case only was no change: neither key was enqueued, and the controller
--   never heard that its object was renamed;
-- - a filter column of a type with no equality operator (json, xml, point)
--   could not be watched at all: the watch failed with "operator does not
--   exist: json = json".
-- Each column is now compared as its text, byte by byte
-- (`OLD.c::text COLLATE "C" IS DISTINCT FROM NEW.c::text COLLATE "C"`;
-- every type converts to text). A value that is equal but written otherwise
-- (numeric 1.0 and 1.00) now counts as a change: one more enqueue, which
-- coalesces, rather than a change missed.
--
-- And a TRUNCATE of a partition of a watched partitioned table enqueues the keys
-- it held, as a TRUNCATE of a watched table does (migration 0010). The row
-- triggers of a partitioned table are cloned onto its partitions, but its
-- TRUNCATE trigger is not: `TRUNCATE machines_2026_01` (a partition) removed
-- its rows and enqueued nothing, so the controller never heard that those
-- objects were gone.
-- - drover_watch_install puts the TRUNCATE trigger on every partition the
--   table has (at every level) too, and drover_unwatch takes it off them.
-- - drover_watch_truncate on a partitioned table reads only the partitions
--   without a trigger of their own (attached or made after the watch): a
--   TRUNCATE of the parent fires each partition's trigger as well, and
--   each enqueues its own keys once. A partition made after the watch is
--   still not followed when it is truncated by itself: unwatch the table
--   and watch it again to give it the trigger.
-- The filtered watches and the watches of partitioned tables made before
-- are installed again (below).

CREATE OR REPLACE FUNCTION drover_watch_install(rel_name text, process text, key_column text,
    columns text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    changed text;
    part record;
BEGIN
    IF columns IS NOT NULL AND cardinality(columns) > 0 THEN
        SELECT string_agg(format('OLD.%1$I::text COLLATE "C" IS DISTINCT FROM NEW.%1$I::text COLLATE "C"', c),
                          ' OR ') INTO changed
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
    FOR part IN SELECT t.relid FROM pg_partition_tree(rel_name::regclass) AS t
                WHERE t.level > 0 LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_truncate ON %s', part.relid::regclass);
        EXECUTE format('CREATE TRIGGER drover_watch_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION drover_watch_truncate(%L, %L)',
                       part.relid::regclass, process, key_column);
    END LOOP;
END $$;

-- drover_watch_truncate as migration 0019 made it, reading the table itself
-- and those of its partitions that have no trigger of their own.
CREATE OR REPLACE FUNCTION drover_watch_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    keys text[];
    found text[];
    part record;
    rel_name text := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    context text := NULLIF(current_setting('drover.traceparent', true), '');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = TG_RELID
                   AND a.attname = TG_ARGV[1] AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'drover watch of %: key column "%" is gone (renamed or dropped); run drover unwatch %, then watch it again',
            rel_name, replace(TG_ARGV[1], '"', '""'), rel_name USING ERRCODE = '42703';
    END IF;
    -- The table itself when it holds rows (pg_partition_tree lists nothing
    -- for a table that is not partitioned, nor a partition).
    FOR part IN SELECT c.oid AS relid FROM pg_class c
                WHERE c.oid = TG_RELID AND c.relkind <> 'p'
                UNION
                SELECT t.relid FROM pg_partition_tree(TG_RELID) AS t
                WHERE t.isleaf AND t.relid <> TG_RELID
                    AND NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = t.relid
                                        AND g.tgname = 'drover_watch_truncate') LOOP
        EXECUTE format('SELECT array_agg(DISTINCT to_jsonb(t) ->> %L) FROM ONLY %s AS t '
                       'WHERE to_jsonb(t) ->> %L IS NOT NULL',
                       TG_ARGV[1], part.relid::regclass, TG_ARGV[1]) INTO found;
        keys := keys || found;
    END LOOP;
    IF keys IS NOT NULL AND cardinality(keys) > 0 THEN
        PERFORM drover_enqueue(TG_ARGV[0], keys);
        IF context IS NOT NULL THEN
            PERFORM drover_trace_link(TG_ARGV[0], keys, context);
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- drover_unwatch as migration 0013 made it, taking the TRUNCATE trigger off
-- the table's partitions too.
CREATE OR REPLACE FUNCTION drover_unwatch(relation text) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    rel regclass := to_regclass(drover_unwatch.relation);
    rel_name text;
    part record;
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
    FOR part IN SELECT t.relid FROM pg_partition_tree(rel) AS t WHERE t.level > 0 LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS drover_watch_truncate ON %s', part.relid::regclass);
    END LOOP;
    RETURN rel_name;
END $$;

-- The filtered watches and the watches of partitioned tables made before,
-- installed again under their table's name now, when the table still has
-- every column they name (one whose columns are gone is left as it is, to
-- fail its writers as migration 0013 says). A watch whose table this role
-- may not change keeps its old triggers, with a WARNING saying how to mend it.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT format('%I.%I', n.nspname, c.relname) AS name, w.process, w.key_column,
                    w.columns
             FROM drover_watches w
             JOIN pg_class c ON c.oid = w.relid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE (w.columns IS NOT NULL OR c.relkind = 'p')
                 AND EXISTS (SELECT 1 FROM pg_trigger t
                             WHERE t.tgrelid = c.oid AND t.tgname = 'drover_watch')
                 AND NOT EXISTS (SELECT 1 FROM unnest(array_prepend(w.key_column, w.columns)) AS col
                                 WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                                                   WHERE a.attrelid = c.oid AND a.attname = col
                                                       AND a.attnum > 0 AND NOT a.attisdropped))
    LOOP
        BEGIN
            PERFORM drover_watch_install(r.name, r.process, r.key_column, r.columns);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'drover: the watch of % keeps its old triggers (its filter compares by collation, a TRUNCATE of one of its partitions enqueues nothing) (%); unwatch it and watch it again as its owner',
                r.name, SQLERRM;
        END;
    END LOOP;
END $$;

-- CREATE OR REPLACE reset the trigger function's settings: pin its
-- search_path again, as migrations 0010, 0013 and 0019 did and for their
-- reasons.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION drover_watch_truncate() SET search_path = %I, pg_temp',
                   current_schema());
END $$;

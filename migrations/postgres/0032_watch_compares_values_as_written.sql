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
CREATE OR REPLACE FUNCTION drover_watch_install(rel_name text, process text, key_column text,
    columns text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    changed text;
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
END $$;

-- The filtered watches made before: installed again under their table's
-- name now, when the table still has every column they name (one whose
-- columns are gone is left as it is, to fail its writers as migration 0013
-- says). A watch whose table this role may not change keeps its old
-- trigger, with a WARNING saying how to mend it.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT format('%I.%I', n.nspname, c.relname) AS name, w.process, w.key_column,
                    w.columns
             FROM drover_watches w
             JOIN pg_class c ON c.oid = w.relid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE w.columns IS NOT NULL
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
            RAISE WARNING 'drover: the watch of % still compares its columns by their collation (%); unwatch it and watch it again as its owner',
                r.name, SQLERRM;
        END;
    END LOOP;
END $$;

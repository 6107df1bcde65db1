-- A watched table's change carries the trace context of the transaction that
-- made it (issue 38: watch triggers take an optional context). A trigger has
-- no argument a caller could pass, so the context is a setting of the
-- caller's transaction:
--
--     SET LOCAL drover.traceparent = '00-<trace id>-<span id>-01';
--     UPDATE machines SET … WHERE …;   -- a watched table
--
-- Each key the triggers enqueue then gets the context linked to its next run,
-- as `drover_trace_link` does (the first 8 and the last 8 kept, the rest
-- counted). Unset or empty, nothing is linked and nothing more is written.
-- `SET LOCAL` ends with the transaction, so it works through a
-- transaction-pooling PgBouncer too. The triggers are those of migration
-- 0013, with the link added after the enqueue.

CREATE OR REPLACE FUNCTION drover_watch_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_row jsonb;
    new_row jsonb;
    rel_name text;
    keys text[];
    context text := NULLIF(current_setting('drover.traceparent', true), '');
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
    keys := ARRAY(SELECT DISTINCT k FROM unnest(ARRAY[old_row ->> TG_ARGV[1], new_row ->> TG_ARGV[1]]) AS k
                  WHERE k IS NOT NULL);
    PERFORM drover_enqueue(TG_ARGV[0], keys);
    IF context IS NOT NULL THEN
        PERFORM drover_trace_link(TG_ARGV[0], keys, context);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION drover_watch_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    keys text[];
    rel_name text := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    context text := NULLIF(current_setting('drover.traceparent', true), '');
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
        IF context IS NOT NULL THEN
            PERFORM drover_trace_link(TG_ARGV[0], keys, context);
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- CREATE OR REPLACE reset the trigger functions' settings: pin their
-- search_path again, as migrations 0010 and 0013 did and for their reasons
-- (the triggers run in the writer's session, whose search_path must not
-- choose which drover_enqueue or drover_trace_link they call).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION drover_watch_row() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION drover_watch_truncate() SET search_path = %I, pg_temp',
                   current_schema());
END $$;

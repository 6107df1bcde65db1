-- Trace contexts follow the change (issue 38, DESIGN.md rule 14).
--
-- `trace_links`: the W3C contexts of the enqueues coalesced into the item's
-- next run, as `{"links": [...], "dropped": n}` (the first and the last 8
-- contexts, each `traceparent` or `traceparent tracestate`, and a count of the
-- ones between); NULL when no enqueue carried a context, which is always the
-- case with tracing off. `trace_run`: the contexts the current (or last) run
-- absorbed, moved there when its lease started, so an enqueue during the run
-- starts a fresh set for the run after it.
ALTER TABLE drover_items ADD COLUMN trace_links jsonb, ADD COLUMN trace_run jsonb;

-- The move, for every way a lease starts (the claims, the gated claim,
-- `lease_lock`): when a new lease token is written and contexts are waiting
-- or an earlier run's are left (a run with none must not show its
-- predecessor's). With tracing off both are NULL and the function never runs.
CREATE FUNCTION drover_items_trace_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.trace_run := NEW.trace_links;
    NEW.trace_links := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER drover_items_trace_run
BEFORE UPDATE OF lease_token ON drover_items
FOR EACH ROW
WHEN (NEW.state = 'running' AND NEW.lease_token IS DISTINCT FROM OLD.lease_token
      AND (NEW.trace_links IS NOT NULL OR NEW.trace_run IS NOT NULL))
EXECUTE FUNCTION drover_items_trace_run();

-- Adds the W3C trace context `context` (`traceparent`, or `traceparent
-- tracestate`) to the next run of each of `keys` of `process`, in the
-- caller's transaction: call it after `drover_enqueue` with the same keys.
-- An item keeps the first and the last 8 contexts and counts the ones
-- between. Keys that are not items are skipped; a NULL context does nothing.
CREATE FUNCTION drover_trace_link(process text, keys text[], context text)
RETURNS void
LANGUAGE sql AS $$
    UPDATE drover_items AS i SET trace_links = CASE
        WHEN i.trace_links IS NULL
            THEN jsonb_build_object('links', jsonb_build_array(context), 'dropped', 0)
        WHEN jsonb_array_length(i.trace_links -> 'links') < 16
            THEN jsonb_set(i.trace_links, '{links}',
                           (i.trace_links -> 'links') || jsonb_build_array(context))
        ELSE jsonb_build_object(
            'links', ((i.trace_links -> 'links') - 8) || jsonb_build_array(context),
            'dropped', (i.trace_links ->> 'dropped')::bigint + 1)
        END
    WHERE context IS NOT NULL AND i.process = drover_trace_link.process
        AND i.key = ANY(drover_trace_link.keys)
$$;

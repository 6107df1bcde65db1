-- Trace contexts follow the change (issue 38, DESIGN.md rule 14).
--
-- `trace_links`: the W3C contexts of the enqueues coalesced into the item's
-- next run, as JSON `{"links": [...], "dropped": n}` (the first and the last 8
-- contexts, each `traceparent` or `traceparent tracestate`, and a count of the
-- ones between); NULL when no enqueue carried a context, which is always the
-- case with tracing off. `trace_run`: the contexts the current (or last) run
-- absorbed, moved there when its lease started, so an enqueue during the run
-- starts a fresh set for the run after it.
ALTER TABLE drover_items ADD COLUMN trace_links TEXT;
ALTER TABLE drover_items ADD COLUMN trace_run TEXT;

-- The move, for every way a lease starts (the claims and `lease_lock`): when
-- a new lease token is written and contexts are waiting or an earlier run's
-- are left (a run with none must not show its predecessor's). With tracing
-- off both are NULL and the trigger's body never runs.
CREATE TRIGGER drover_items_trace_run
AFTER UPDATE OF lease_token ON drover_items
WHEN NEW.state = 'running' AND NEW.lease_token IS NOT OLD.lease_token
    AND (NEW.trace_links IS NOT NULL OR NEW.trace_run IS NOT NULL)
BEGIN
    UPDATE drover_items SET trace_run = NEW.trace_links, trace_links = NULL
    WHERE id = NEW.id;
END;

-- A trace context given in SQL is checked before it is kept (issue 38). The
-- HTTP API and the library check a context before it reaches the store; SQL
-- callers (`drover_trace_link`, and through it the watch triggers'
-- `drover.traceparent` setting of migration 0019) were not checked, so a
-- buggy or hostile caller could keep up to 16 strings of any size on an
-- item. The claim leaves out what is not a context, so no run was ever lost
-- or doubled, but the row could grow without bound.
--
-- Now a context that is not W3C — `00-<32 hex>-<16 hex>-<2 hex>` with
-- neither id all zeros, then optionally a space and a `tracestate` of at
-- most 512 printable ASCII bytes — is left out with a WARNING, and the keys
-- stay enqueued: W3C asks a receiver to ignore a malformed context and carry
-- on, and a watched table's write must not fail for its caller's setting.

-- Whether `context` is a W3C trace context as the store keeps it (the same
-- rule as `TraceContext::new` in Rust).
CREATE FUNCTION drover_trace_context_valid(context text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT octet_length(context) <= 568
        AND context ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}( [ -~]+)?$'
        AND substr(context, 4, 32) <> repeat('0', 32)
        AND substr(context, 37, 16) <> repeat('0', 16)
$$;

-- Migration 0015's function, with the check in front.
CREATE OR REPLACE FUNCTION drover_trace_link(process text, keys text[], context text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF drover_trace_link.context IS NULL THEN
        RETURN;
    END IF;
    IF NOT drover_trace_context_valid(drover_trace_link.context) THEN
        RAISE WARNING 'drover_trace_link: % is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>, then optionally a space and a tracestate of at most 512 printable ASCII bytes); the keys stay enqueued without it',
            quote_literal(left(drover_trace_link.context, 80));
        RETURN;
    END IF;
    UPDATE drover_items AS i SET trace_links = CASE
        WHEN i.trace_links IS NULL
            THEN jsonb_build_object('links', jsonb_build_array(drover_trace_link.context),
                                    'dropped', 0)
        WHEN jsonb_array_length(i.trace_links -> 'links') < 16
            THEN jsonb_set(i.trace_links, '{links}',
                           (i.trace_links -> 'links')
                               || jsonb_build_array(drover_trace_link.context))
        ELSE jsonb_build_object(
            'links', ((i.trace_links -> 'links') - 8)
                         || jsonb_build_array(drover_trace_link.context),
            'dropped', (i.trace_links ->> 'dropped')::bigint + 1)
        END
    WHERE i.process = drover_trace_link.process AND i.key = ANY(drover_trace_link.keys);
END $$;

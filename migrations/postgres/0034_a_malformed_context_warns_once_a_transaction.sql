-- drover_trace_link warns once per transaction for one malformed context,
-- not once per call.
--
-- A watched table's row trigger links every key it enqueues to the
-- transaction's `drover.traceparent`; set to something that is not a W3C
-- context, each row raised the same WARNING, so an UPDATE of a million rows
-- sent a million warnings to its client (and, at PostgreSQL's default
-- log_min_messages, wrote them to the server's log). The first call that
-- meets a malformed context in a transaction warns, and remembers the
-- context (its length and first 64 characters: no hash function is sure to be
-- there, md5 is refused in FIPS mode) in a transaction-local setting
-- (`drover.trace_warned`); later calls with that context stay quiet.
-- Otherwise it is migration 0020's.

CREATE OR REPLACE FUNCTION drover_trace_link(process text, keys text[], context text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF drover_trace_link.context IS NULL THEN
        RETURN;
    END IF;
    IF NOT drover_trace_context_valid(drover_trace_link.context) THEN
        IF current_setting('drover.trace_warned', true) IS DISTINCT FROM
               length(drover_trace_link.context) || ':' || left(drover_trace_link.context, 64) THEN
            RAISE WARNING 'drover_trace_link: % is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>, then optionally a space and a tracestate of at most 512 printable ASCII bytes); the keys stay enqueued without it (said once in this transaction)',
                quote_literal(left(drover_trace_link.context, 80));
            PERFORM set_config('drover.trace_warned',
                length(drover_trace_link.context) || ':' || left(drover_trace_link.context, 64),
                true);
        END IF;
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

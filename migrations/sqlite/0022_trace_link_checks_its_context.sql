-- A trace context given in SQL is checked before it is kept (issue 38), as
-- PostgreSQL's migration 0020 does for `drover_trace_link`. The store's own
-- contexts are checked in Rust before they reach the view; other programs'
-- were not, so a buggy or hostile caller could keep up to 16 strings of any
-- size on an item (the claim left them out, so no run was lost or doubled,
-- but the row could grow without bound).
--
-- Now a row whose context is not W3C — `00-<32 hex>-<16 hex>-<2 hex>` with
-- neither id all zeros, then optionally a space and a `tracestate` of at
-- most 512 printable ASCII bytes; text, no NUL — is ignored (SQLite has no
-- warnings to give), and the keys stay enqueued: W3C asks a receiver to
-- ignore a malformed context and carry on. Migration 0020's trigger, with
-- the check in its WHEN.
DROP TRIGGER drover_trace_link_row;

CREATE TRIGGER drover_trace_link_row INSTEAD OF INSERT ON drover_trace_link
WHEN typeof(NEW.context) = 'text'
    -- Counted in characters up to a NUL and in bytes: equal only for ASCII
    -- without NUL.
    AND length(NEW.context) = length(CAST(NEW.context AS BLOB))
    AND length(NEW.context) BETWEEN 55 AND 568
    AND substr(NEW.context, 1, 55) GLOB
        '00-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f]'
    AND substr(NEW.context, 4, 32) <> '00000000000000000000000000000000'
    AND substr(NEW.context, 37, 16) <> '0000000000000000'
    AND (length(NEW.context) = 55
         OR (length(NEW.context) > 56 AND substr(NEW.context, 56, 1) = ' '
             AND NOT substr(NEW.context, 57) GLOB '*[^ -~]*'))
BEGIN
    UPDATE drover_items SET trace_links = CASE
        WHEN trace_links IS NULL
            THEN json_object('links', json_array(NEW.context), 'dropped', 0)
        WHEN json_array_length(trace_links, '$.links') < 16
            THEN json_insert(trace_links, '$.links[#]', NEW.context)
        ELSE json_set(json_insert(json_remove(trace_links, '$.links[8]'), '$.links[#]',
                                  NEW.context),
                      '$.dropped', json_extract(trace_links, '$.dropped') + 1)
        END
    WHERE process = NEW.process AND key = NEW.key;
END;

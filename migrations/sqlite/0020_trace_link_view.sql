-- Trace contexts from SQL (issue 38, DESIGN.md rule 14): other programs, and
-- the store itself, add a W3C context to the next run of a key by inserting
-- into the view `drover_trace_link`, after `drover_enqueue` in the same
-- transaction, as PostgreSQL's function `drover_trace_link` (its migration
-- 0015) takes it:
--
--   INSERT INTO drover_enqueue (process, key) VALUES ('provision', 'a');
--   INSERT INTO drover_trace_link (process, key, context)
--   VALUES ('provision', 'a', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
--
-- `context` is a `traceparent`, or a `traceparent`, a space and a
-- `tracestate`. A key that is not an item is skipped; a NULL context does
-- nothing; a context that is not valid W3C is kept and left out when the run
-- reads it. An item keeps the first and the last 8 contexts and counts the
-- ones between (`TRACE_LINKS_KEPT`), as migration 0018 describes.
CREATE VIEW drover_trace_link AS
SELECT CAST(NULL AS TEXT) AS process, CAST(NULL AS TEXT) AS key, CAST(NULL AS TEXT) AS context
WHERE 0;

CREATE TRIGGER drover_trace_link_row INSTEAD OF INSERT ON drover_trace_link
WHEN NEW.context IS NOT NULL
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

-- The SQL enqueue (`drover_enqueue`, and so every watched table's trigger)
-- refuses a process name or key that is not valid UTF-8.
--
-- SQLite stores whatever bytes SQL hands it as text (`CAST(X'66FF' AS TEXT)`,
-- a BLOB key column cast by a watch trigger), and nothing downstream can
-- take such a name: no worker can be handed the key, and every list that
-- meets the row (the process page, the bulk actions, the API's item lists)
-- failed to decode it. PostgreSQL refuses such text itself; here the view
-- refuses it at the door, with the same kind of one-line error as a key that
-- is too long, and the caller's statement changes nothing.
--
-- A trigger of its own beside `drover_enqueue_row`: `RAISE(ABORT)` undoes the
-- whole statement, whichever of the two ran first. The common names (printable
-- ASCII) are cleared by the `WHEN`'s `GLOB`s; any other is checked character by
-- character: SQLite decodes a malformed sequence to U+FFFD or to a value that
-- `char()` encodes differently, so a character is valid exactly when encoding
-- its code point gives back its own bytes and the code point is at most
-- U+10FFFF. Names over 1,024 bytes are left to `drover_enqueue_row`, which
-- refuses them without this walk. (A key written before this migration, or
-- into `drover_items` directly, is parked by the claim that meets it: see
-- `park_undecodable` in `src/store/sqlite/leases.rs`.)
CREATE TRIGGER drover_enqueue_utf8 INSTEAD OF INSERT ON drover_enqueue
WHEN NEW.process GLOB '*[^ -~]*' OR NEW.key GLOB '*[^ -~]*'
BEGIN
    SELECT RAISE(ABORT, 'drover_enqueue: a process name and a key must be valid UTF-8 text')
    WHERE EXISTS (
        WITH RECURSIVE
            name(t) AS (VALUES (NEW.process), (NEW.key)),
            c(t, i) AS (
                SELECT t, 1 FROM name
                WHERE typeof(t) = 'text' AND length(CAST(t AS BLOB)) <= 1024
                    AND t GLOB '*[^ -~]*'
                UNION ALL SELECT t, i + 1 FROM c WHERE i < length(t))
        SELECT 1 FROM c
        WHERE unicode(substr(t, i, 1)) > 1114111
           OR CAST(char(unicode(substr(t, i, 1))) AS BLOB) IS NOT CAST(substr(t, i, 1) AS BLOB));
END;

-- Error signatures kept on the item (issue 14: the first view of a process
-- with tens of thousands of failing keys). `error_signature` is the item's
-- last error as `error_signature` in src/store/groups.rs makes it (the key
-- replaced by `<key>`, every run of ASCII digits by `<n>`), written by the
-- store wherever it writes `last_error` (NULL when that is NULL). The error
-- groups count it straight from the two partial indexes below, without
-- reading a row per failing key, and the bulk actions by signature match it,
-- so a group and its action read the same value.
ALTER TABLE drover_items ADD COLUMN error_signature TEXT;

-- The errors already stored, by the same rule in SQL: the key replaced, then
-- the text walked a character at a time, each run of ASCII digits ('0'..'9'
-- compared byte-wise as single characters) becoming one `<n>`.
UPDATE drover_items SET error_signature = (
    WITH RECURSIVE walk(rest, out, digit) AS (
        SELECT replace(last_error, key, '<key>'), '', 0
        UNION ALL
        SELECT substr(rest, 2),
            out || CASE WHEN substr(rest, 1, 1) BETWEEN '0' AND '9'
                        THEN CASE WHEN digit THEN '' ELSE '<n>' END
                        ELSE substr(rest, 1, 1) END,
            substr(rest, 1, 1) BETWEEN '0' AND '9'
        FROM walk WHERE rest <> '')
    SELECT out FROM walk WHERE rest = '')
WHERE last_error IS NOT NULL;

-- Parked keys by signature: the parked half of the groups is a walk of this
-- index in signature order (the rowid is in every SQLite index, so the
-- group's first key comes with it).
CREATE INDEX drover_items_parked_errors ON drover_items (process, error_signature)
    WHERE state = 'parked';

-- The backoff index of 0007 with the signature added, so the backing-off half
-- of the groups reads the index alone. Same columns first, same rows: every
-- read that used the old one uses this one.
DROP INDEX drover_items_backoff;
CREATE INDEX drover_items_backoff ON drover_items (process, backoff_until, id, error_signature)
    WHERE state = 'pending' AND backoff_until IS NOT NULL;

-- Error signatures kept on the item (issue 14: the first view of a process
-- with tens of thousands of failing keys). `error_signature` is the item's
-- last error as `error_signature` in src/store/groups.rs makes it (the key
-- replaced by `<key>`, every run of ASCII digits by `<n>`), written by the
-- store wherever it writes `last_error` (NULL when that is NULL). The error
-- groups count it straight from the two partial indexes below (index-only
-- scans), without reading a row per failing key, and the bulk actions by
-- signature match it, so a group and its action read the same value.
ALTER TABLE drover_items ADD COLUMN error_signature TEXT COLLATE "C";

-- The errors already stored, by the same rule in SQL (the digits spelled out:
-- no range, so no locale can widen it).
UPDATE drover_items
SET error_signature = regexp_replace(replace(last_error, key, '<key>'), '[0123456789]+', '<n>', 'g')
WHERE last_error IS NOT NULL;

-- Parked keys by signature (and id: the group's first key comes with it).
CREATE INDEX drover_items_parked_errors ON drover_items (process, error_signature, id)
    WHERE state = 'parked';

-- The backoff index of 0007 with the signature carried, so the backing-off
-- half of the groups is an index-only scan. Same key columns, same rows:
-- every read that used the old one uses this one.
DROP INDEX drover_items_backoff;
CREATE INDEX drover_items_backoff ON drover_items (process, backoff_until, id)
    INCLUDE (error_signature) WHERE state = 'pending' AND backoff_until IS NOT NULL;

-- The items' state CHECK written with `=` and `OR` instead of `IN (…)`: the
-- same constraint, without its cost on every write (issue 13's burn-down).
--
-- In a CHECK, SQLite's test of `state IN ('pending', 'running', 'parked',
-- 'idle')` costs about 1.3 µs of every row written (measured, not explained:
-- Python's sqlite3, 100,000 rows updated in batches of 1,024, 2.5–3.0 µs per
-- row with the list, 1.0–1.5 µs with `OR`s or with no CHECK at all; a list of
-- two costs nothing either). Every claim and every completion writes each
-- row's state, so a burn-down paid it twice per key.
--
-- SQLite cannot change a CHECK in place, so the table is rebuilt (SQLite's
-- documented procedure): copied into a new table, the old one dropped, the new
-- one renamed, its indexes and triggers created again. The rename runs with
-- `legacy_alter_table` on, so SQLite does not re-check views and triggers that
-- name `drover_items` (the `drover_enqueue` view's trigger, `drover watch`
-- triggers on other tables) while the name is briefly free: they keep naming
-- `drover_items`, which is the new table once renamed. The ids' sequence is
-- carried over, so no id is ever handed out twice. The counts are unchanged:
-- the copy goes into a table with no triggers yet.
CREATE TABLE drover_items_v12 (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    process           TEXT    NOT NULL,
    key               TEXT    NOT NULL,
    state             TEXT    NOT NULL
        CHECK (state = 'pending' OR state = 'running' OR state = 'parked' OR state = 'idle'),
    priority          INTEGER NOT NULL DEFAULT 0,
    ready_at          INTEGER NOT NULL,
    enqueued_at       INTEGER NOT NULL,
    failures          INTEGER NOT NULL DEFAULT 0,
    backoff_until     INTEGER,
    backoff_ms        INTEGER,
    last_error        TEXT,
    dirty_since       INTEGER,
    dirty_ready_at    INTEGER,
    dirty_priority    INTEGER,
    lease_session     INTEGER,
    lease_token       INTEGER,
    started_at        INTEGER,
    first_enqueued_at INTEGER,
    last_enqueued_at  INTEGER,
    enqueue_count     INTEGER NOT NULL DEFAULT 0,
    last_outcome      TEXT,
    last_ended_at     INTEGER,
    error_signature   TEXT,
    counts_mark       INTEGER NOT NULL DEFAULT 0,
    UNIQUE (process, key)
);
INSERT INTO drover_items_v12 (id, process, key, state, priority, ready_at, enqueued_at,
    failures, backoff_until, backoff_ms, last_error, dirty_since, dirty_ready_at,
    dirty_priority, lease_session, lease_token, started_at, first_enqueued_at,
    last_enqueued_at, enqueue_count, last_outcome, last_ended_at, error_signature,
    counts_mark)
SELECT id, process, key, state, priority, ready_at, enqueued_at,
    failures, backoff_until, backoff_ms, last_error, dirty_since, dirty_ready_at,
    dirty_priority, lease_session, lease_token, started_at, first_enqueued_at,
    last_enqueued_at, enqueue_count, last_outcome, last_ended_at, error_signature,
    counts_mark
FROM drover_items;
-- The copy set the new table's sequence to its largest id; the old one may be
-- past it (the newest items deleted), or the copy may have been empty.
UPDATE sqlite_sequence
SET seq = MAX(seq, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'drover_items'), 0))
WHERE name = 'drover_items_v12';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'drover_items_v12', seq FROM sqlite_sequence WHERE name = 'drover_items'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'drover_items_v12');
DROP TABLE drover_items;
PRAGMA legacy_alter_table = ON;
ALTER TABLE drover_items_v12 RENAME TO drover_items;
PRAGMA legacy_alter_table = OFF;

CREATE INDEX drover_items_claim
    ON drover_items (process, priority DESC, ready_at, id) WHERE state = 'pending';
CREATE INDEX drover_items_leases
    ON drover_items (lease_session, lease_token) WHERE state = 'running';
CREATE INDEX drover_items_settled ON drover_items (process, key)
    WHERE state IN ('running', 'parked');
CREATE INDEX drover_items_parked_errors ON drover_items (process, error_signature)
    WHERE state = 'parked';
CREATE INDEX drover_items_backoff ON drover_items (process, backoff_until, id, error_signature)
    WHERE state = 'pending' AND backoff_until IS NOT NULL;

CREATE TRIGGER drover_items_counted_insert AFTER INSERT ON drover_items
BEGIN
    INSERT INTO drover_item_counts (process, state, n) VALUES (new.process, new.state, 1)
        ON CONFLICT (process, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER drover_items_counted_delete AFTER DELETE ON drover_items
BEGIN
    UPDATE drover_item_counts SET n = n - 1 WHERE process = old.process AND state = old.state;
END;
CREATE TRIGGER drover_items_counted_update AFTER UPDATE OF state ON drover_items
    WHEN old.state <> new.state AND new.counts_mark = old.counts_mark
BEGIN
    UPDATE drover_item_counts SET n = n + CASE state WHEN new.state THEN 1 ELSE -1 END
    WHERE process = new.process AND state IN (old.state, new.state);
END;

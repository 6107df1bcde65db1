-- A watch follows its table through renames, and sees the rows an
-- `OR REPLACE` deletes (issue 35).
--
-- A watch is found by its triggers, whose `tbl_name` SQLite moves along with
-- ALTER TABLE … RENAME: unwatch found nothing under the table's new name, and
-- watch of it went ahead as if it were not watched. `relation` keeps the name
-- the table was watched under, used only once the table (and its triggers
-- with it) is dropped; so it is no longer UNIQUE: a new table may take a
-- renamed one's old name and be watched too. SQLite cannot drop a constraint
-- in place, so the (small) table is rebuilt as 0012 rebuilt the items: copied,
-- dropped, the copy renamed with `legacy_alter_table` on (nothing names it),
-- its id sequence carried over, so no watch id, and no trigger name, is ever
-- handed out twice.
--
-- Each watch gains two triggers, before an insert and an update, that enqueue
-- the keys of the rows the new values collide with on a unique index: the
-- rows an `OR REPLACE` deletes without firing their delete trigger (the
-- writer's `recursive_triggers` is off). SQL cannot write them (they depend on
-- each table's indexes), so the store installs them for the watches made
-- before, right after applying this migration, in the same transaction.
CREATE TABLE drover_watches_v17 (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    relation   TEXT    NOT NULL,
    process    TEXT    NOT NULL,
    key_column TEXT    NOT NULL,
    columns    TEXT,
    created_at INTEGER NOT NULL
);
INSERT INTO drover_watches_v17 (id, relation, process, key_column, columns, created_at)
SELECT id, relation, process, key_column, columns, created_at FROM drover_watches;
UPDATE sqlite_sequence
SET seq = MAX(seq, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'drover_watches'), 0))
WHERE name = 'drover_watches_v17';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'drover_watches_v17', seq FROM sqlite_sequence WHERE name = 'drover_watches'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'drover_watches_v17');
DROP TABLE drover_watches;
PRAGMA legacy_alter_table = ON;
ALTER TABLE drover_watches_v17 RENAME TO drover_watches;
PRAGMA legacy_alter_table = OFF;

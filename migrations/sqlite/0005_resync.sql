-- Resync (issue 15), as on PostgreSQL: every idle key of a process becomes
-- pending again once per interval, at a low priority. NULL interval: never.
ALTER TABLE drover_processes ADD COLUMN resync_every_ms INTEGER;
ALTER TABLE drover_processes ADD COLUMN resync_jitter REAL NOT NULL DEFAULT 0.1;
ALTER TABLE drover_processes ADD COLUMN resync_priority INTEGER NOT NULL DEFAULT -100;

-- Where each process's resync walk stands, shared by every connection to the
-- file (see the PostgreSQL migration for the columns).
CREATE TABLE drover_resync (
    process            TEXT PRIMARY KEY
                       REFERENCES drover_processes (process) ON DELETE CASCADE,
    walk_key           TEXT,
    pass_started_at    INTEGER,
    pass_next_due      INTEGER,
    pass_resynced      INTEGER NOT NULL DEFAULT 0,
    next_due_at        INTEGER,
    last_pass_ended_at INTEGER,
    last_pass_resynced INTEGER NOT NULL DEFAULT 0
);

-- Known keys and one history row per run (issue 13), as on PostgreSQL.
--
-- An item is now the durable record of a known key: a run that ends `done`
-- leaves it `idle` (converged, its last outcome kept) instead of deleting it,
-- and only a delete forgets it. The history records runs, not steps: one row
-- per run, written when it ends, plus one per operator action.

-- Items: SQLite cannot change a CHECK constraint in place, so the table is
-- rebuilt with the idle state and what an item remembers about its enqueues
-- and its last run.
CREATE TABLE drover_items_v3 (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    process           TEXT    NOT NULL,
    key               TEXT    NOT NULL,
    state             TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'parked', 'idle')),
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
    UNIQUE (process, key)
);
-- Existing items were enqueued at least once; their first enqueue is unknown.
INSERT INTO drover_items_v3 (id, process, key, state, priority, ready_at, enqueued_at,
    failures, backoff_until, backoff_ms, last_error, dirty_since, dirty_ready_at,
    dirty_priority, lease_session, lease_token, started_at, last_enqueued_at, enqueue_count)
SELECT id, process, key, state, priority, ready_at, enqueued_at, failures, backoff_until,
    backoff_ms, last_error, dirty_since, dirty_ready_at, dirty_priority, lease_session,
    lease_token, started_at, enqueued_at, 1
FROM drover_items;
DROP TABLE drover_items;
ALTER TABLE drover_items_v3 RENAME TO drover_items;
CREATE INDEX drover_items_claim
    ON drover_items (process, priority DESC, ready_at, id) WHERE state = 'pending';
CREATE INDEX drover_items_leases
    ON drover_items (lease_session, lease_token) WHERE state = 'running';
-- Running and parked keys are listed by key through this index; idle keys,
-- which may be most rows, stay out of it (as pending ones do).
CREATE INDEX drover_items_settled ON drover_items (process, key)
    WHERE state IN ('running', 'parked');

-- Retention, per process: runs kept for a period and at most N per key; idle
-- keys forgotten after a period (NULL: never).
ALTER TABLE drover_processes ADD COLUMN keep_runs_ms INTEGER NOT NULL DEFAULT 604800000;
ALTER TABLE drover_processes ADD COLUMN keep_runs_per_key INTEGER NOT NULL DEFAULT 100;
ALTER TABLE drover_processes ADD COLUMN forget_idle_ms INTEGER;

-- One row per run, or per operator action (`actor` set, no lease).
CREATE TABLE drover_runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    process       TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    outcome       TEXT    NOT NULL,
    attempt       INTEGER,
    session       INTEGER,
    token         INTEGER,
    pending_since INTEGER,
    started_at    INTEGER,
    ended_at      INTEGER NOT NULL,
    error         TEXT,
    actor         TEXT
);
-- A key's runs, newest first; also the walk that caps runs per key.
CREATE INDEX drover_runs_key ON drover_runs (process, key, id);
-- Pruning by age.
CREATE INDEX drover_runs_ended ON drover_runs (ended_at);

-- The old event log becomes runs: each run's ending event is its row, with
-- its start from the `started` event of the same lease; operator actions keep
-- their rows. Enqueue and start events have no row of their own any more.
CREATE INDEX drover_history_token ON drover_history (token) WHERE event = 'started';
INSERT INTO drover_runs (process, key, outcome, attempt, session, token, started_at,
    ended_at, error, actor)
SELECT h.process, h.key,
    CASE h.event
        WHEN 'finished' THEN 'done'
        WHEN 'failed' THEN CASE WHEN h.transient THEN 'retry' ELSE 'parked' END
        ELSE h.event END,
    CASE WHEN h.session IS NULL THEN NULL ELSE h.attempt END,
    h.session, h.token,
    (SELECT s.at FROM drover_history s WHERE s.event = 'started' AND s.token = h.token),
    h.at, h.error,
    CASE WHEN h.session IS NULL THEN 'unknown' END
FROM drover_history h
WHERE h.event IN ('finished', 'failed', 'canceled', 'expired', 'retried', 'deleted')
   OR (h.event = 'parked' AND h.session IS NULL)
ORDER BY h.id;
DROP TABLE drover_history;

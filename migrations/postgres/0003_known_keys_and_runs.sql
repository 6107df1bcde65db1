-- Known keys and one history row per run (issue 13).
--
-- An item is now the durable record of a known key: a run that ends `done`
-- leaves it `idle` (converged, its last outcome kept) instead of deleting it,
-- and only a delete forgets it. The history records runs, not steps: one row
-- per run, written when it ends, plus one per operator action.

-- Items: the idle state, and what an item remembers about its enqueues and
-- its last run.
ALTER TABLE drover_items DROP CONSTRAINT drover_items_state_check;
ALTER TABLE drover_items ADD CONSTRAINT drover_items_state_check
    CHECK (state IN ('pending', 'running', 'parked', 'idle'));
ALTER TABLE drover_items
    ADD COLUMN first_enqueued_at TIMESTAMPTZ,
    ADD COLUMN last_enqueued_at  TIMESTAMPTZ,
    ADD COLUMN enqueue_count     BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN last_outcome      TEXT,
    ADD COLUMN last_ended_at     TIMESTAMPTZ;
-- Existing items were enqueued at least once; their first enqueue is unknown.
UPDATE drover_items SET last_enqueued_at = enqueued_at, enqueue_count = 1;
-- Running and parked keys are listed by key through this index; idle keys,
-- which may be most rows, stay out of it (as pending ones do).
DROP INDEX drover_items_settled;
CREATE INDEX drover_items_settled ON drover_items (process, key)
    WHERE state IN ('running', 'parked');

-- Retention, per process: runs kept for a period and at most N per key; idle
-- keys forgotten after a period (NULL: never).
ALTER TABLE drover_processes
    ADD COLUMN keep_runs_ms      BIGINT  NOT NULL DEFAULT 604800000,
    ADD COLUMN keep_runs_per_key INTEGER NOT NULL DEFAULT 100,
    ADD COLUMN forget_idle_ms    BIGINT;

-- One row per run, or per operator action (`actor` set, no lease).
CREATE TABLE drover_runs (
    id            BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    process       TEXT COLLATE "C" NOT NULL,
    key           TEXT COLLATE "C" NOT NULL,
    outcome       TEXT        NOT NULL,
    attempt       INTEGER,
    session       BIGINT,
    token         BIGINT,
    pending_since TIMESTAMPTZ,
    started_at    TIMESTAMPTZ,
    ended_at      TIMESTAMPTZ NOT NULL,
    error         TEXT,
    actor         TEXT
);
-- A key's runs, newest first; also the walk that caps runs per key.
CREATE INDEX drover_runs_key ON drover_runs (process, key, id);
-- Runs are appended in time order and pruned by age: a block-range index.
CREATE INDEX drover_runs_ended ON drover_runs USING brin (ended_at);

-- The old event log becomes runs: each run's ending event is its row, with
-- its start from the `started` event of the same lease; operator actions keep
-- their rows. Enqueue and start events have no row of their own any more.
INSERT INTO drover_runs (process, key, outcome, attempt, session, token, started_at,
    ended_at, error, actor)
SELECT h.process, h.key,
    CASE h.event
        WHEN 'finished' THEN 'done'
        WHEN 'failed' THEN CASE WHEN h.transient THEN 'retry' ELSE 'parked' END
        ELSE h.event END,
    CASE WHEN h.session IS NULL THEN NULL ELSE h.attempt END,
    h.session, h.token, s.at, h.at, h.error,
    CASE WHEN h.session IS NULL THEN 'unknown' END
FROM drover_history h
LEFT JOIN drover_history s ON s.event = 'started' AND s.token = h.token
WHERE h.event IN ('finished', 'failed', 'canceled', 'expired', 'retried', 'deleted')
   OR (h.event = 'parked' AND h.session IS NULL)
ORDER BY h.id;
DROP TABLE drover_history;

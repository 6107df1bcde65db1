-- The dashboard (issue 14): item counts kept in step with the items, the
-- identity of a session's worker, and sampled queue depths for the charts.

-- Items per process and stored state (pending, running, parked, idle), kept by
-- the triggers below in the very transaction that changes an item, so every
-- transition (enqueue, claim, completion, release, reclaim, operator actions,
-- bulk actions, retention) keeps them right without each statement having to.
-- Reading them costs one row per (process, state) instead of a scan of the
-- backlog.
CREATE TABLE drover_item_counts (
    process TEXT    NOT NULL,
    state   TEXT    NOT NULL,
    n       INTEGER NOT NULL,
    PRIMARY KEY (process, state)
) WITHOUT ROWID;
INSERT INTO drover_item_counts (process, state, n)
SELECT process, state, count(*) FROM drover_items GROUP BY process, state;
-- A row for every process and state, so a state change is one UPDATE of
-- two existing rows (items only ever belong to a known process).
INSERT INTO drover_item_counts (process, state, n)
SELECT p.process, s.state, 0 FROM drover_processes p,
    (SELECT 'pending' AS state UNION ALL SELECT 'running' UNION ALL SELECT 'parked'
     UNION ALL SELECT 'idle') s
WHERE true
ON CONFLICT (process, state) DO NOTHING;
CREATE TRIGGER drover_processes_counted AFTER INSERT ON drover_processes
BEGIN
    INSERT INTO drover_item_counts (process, state, n)
    VALUES (new.process, 'pending', 0), (new.process, 'running', 0),
           (new.process, 'parked', 0), (new.process, 'idle', 0)
    ON CONFLICT (process, state) DO NOTHING;
END;

-- Inserts (new keys) upsert, to be safe whatever the order of the rows'
-- creation; deletes and state changes, the hot path, update in place.
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
    WHEN old.state <> new.state
BEGIN
    UPDATE drover_item_counts SET n = n + CASE state WHEN new.state THEN 1 ELSE -1 END
    WHERE process = new.process AND state IN (old.state, new.state);
END;

-- Pending keys that failed, by when their backoff ends: the backoff count and
-- the process page's backoff section read it. Keys that never failed (the
-- bulk of a backlog, and every key of a run that succeeds) stay out of it.
CREATE INDEX drover_items_backoff ON drover_items (process, backoff_until, id)
    WHERE state = 'pending' AND backoff_until IS NOT NULL;

-- Who a session is, for the workers page: host and pid as the worker reported
-- them, and its drover version. NULL for sessions of older clients.
ALTER TABLE drover_sessions ADD COLUMN host TEXT;
ALTER TABLE drover_sessions ADD COLUMN pid INTEGER;
ALTER TABLE drover_sessions ADD COLUMN version TEXT;

-- Queue depth per process, sampled by `drover serve` about once a minute for
-- the depth chart, pruned after a day.
CREATE TABLE drover_depth_samples (
    process TEXT    NOT NULL,
    at      INTEGER NOT NULL,
    pending INTEGER NOT NULL,
    backoff INTEGER NOT NULL,
    running INTEGER NOT NULL,
    parked  INTEGER NOT NULL,
    PRIMARY KEY (process, at)
) WITHOUT ROWID;

-- The dashboard (issue 14): item counts kept in step with the items, the
-- identity of a session's worker, and sampled queue depths for the charts.

-- Items per process and stored state (pending, running, parked, idle). Every
-- statement that changes items appends what it changed to
-- drover_item_count_deltas (statement-level triggers below, in the same
-- transaction), so every transition keeps the counts right without each
-- statement having to. Appending instead of updating one row per (process,
-- state) keeps concurrent claims and completions from queueing on that row's
-- lock; readers add the deltas to the folded counts, and the store folds them
-- in from time to time (one DELETE … RETURNING, so each delta is folded once).
CREATE TABLE drover_item_counts (
    process TEXT COLLATE "C" NOT NULL,
    state   TEXT             NOT NULL,
    n       BIGINT           NOT NULL,
    PRIMARY KEY (process, state)
);
CREATE TABLE drover_item_count_deltas (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    process TEXT COLLATE "C" NOT NULL,
    state   TEXT             NOT NULL,
    delta   BIGINT           NOT NULL
);

CREATE OR REPLACE FUNCTION drover_items_counted_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO drover_item_count_deltas (process, state, delta)
    SELECT process, state, count(*) FROM drover_new_items GROUP BY process, state;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION drover_items_counted_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO drover_item_count_deltas (process, state, delta)
    SELECT process, state, -count(*) FROM drover_old_items GROUP BY process, state;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION drover_items_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO drover_item_count_deltas (process, state, delta)
    SELECT process, state, sum(d) FROM (
        SELECT process, state, 1 AS d FROM drover_new_items
        UNION ALL SELECT process, state, -1 FROM drover_old_items) c
    GROUP BY process, state HAVING sum(d) <> 0;
    RETURN NULL;
END $$;

-- The table is locked by the first trigger until this migration commits, so
-- no change slips between the triggers and the initial count.
CREATE TRIGGER drover_items_counted_insert AFTER INSERT ON drover_items
    REFERENCING NEW TABLE AS drover_new_items
    FOR EACH STATEMENT EXECUTE FUNCTION drover_items_counted_insert();
CREATE TRIGGER drover_items_counted_delete AFTER DELETE ON drover_items
    REFERENCING OLD TABLE AS drover_old_items
    FOR EACH STATEMENT EXECUTE FUNCTION drover_items_counted_delete();
CREATE TRIGGER drover_items_counted_update AFTER UPDATE ON drover_items
    REFERENCING OLD TABLE AS drover_old_items NEW TABLE AS drover_new_items
    FOR EACH STATEMENT EXECUTE FUNCTION drover_items_counted_update();
INSERT INTO drover_item_counts (process, state, n)
SELECT process, state, count(*) FROM drover_items GROUP BY process, state;

-- Pending keys that failed, by when their backoff ends: the backoff count and
-- the process page's backoff section read it. Keys that never failed (the
-- bulk of a backlog, and every key of a run that succeeds) stay out of it.
CREATE INDEX drover_items_backoff ON drover_items (process, backoff_until, id)
    WHERE state = 'pending' AND backoff_until IS NOT NULL;

-- Who a session is, for the workers page: host and pid as the worker reported
-- them, and its drover version. NULL for sessions of older clients.
ALTER TABLE drover_sessions ADD COLUMN host TEXT, ADD COLUMN pid BIGINT,
    ADD COLUMN version TEXT;

-- Queue depth per process, sampled by `drover serve` about once a minute for
-- the depth chart, pruned after a day.
CREATE TABLE drover_depth_samples (
    process TEXT COLLATE "C" NOT NULL,
    at      TIMESTAMPTZ      NOT NULL,
    pending BIGINT           NOT NULL,
    backoff BIGINT           NOT NULL,
    running BIGINT           NOT NULL,
    parked  BIGINT           NOT NULL,
    PRIMARY KEY (process, at)
);

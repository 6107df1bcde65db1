-- Enqueue where the change happens (issue 16), as on PostgreSQL: SQLite has no
-- stored functions, so the enqueue is an insert into the view
-- `drover_enqueue`, carried out by an INSTEAD OF trigger, which any program
-- (and any trigger on the program's own tables) can run inside its own
-- transaction with no extension loaded:
--
--     INSERT INTO drover_enqueue (process, key) VALUES ('provision', 'm-42');
--
-- The store's own enqueue inserts through the same view, so the store's
-- contract suite tests what other programs run.
--
-- Columns: `priority` (default 0), `delay_ms` (default 0), `bypass_backoff`
-- (default 0: an enqueue never shortens a backoff), `clock_offset_ms` (the
-- store's test clock shift, default 0). The clock is read as
-- `julianday('now')`, which every SQLite since 3.0 has (`unixepoch('subsec')`
-- needs 3.42): the same instant, in whole milliseconds.
CREATE VIEW drover_enqueue AS
SELECT CAST(NULL AS TEXT) AS process, CAST(NULL AS TEXT) AS key,
       0 AS priority, 0 AS delay_ms, 0 AS bypass_backoff, 0 AS clock_offset_ms
WHERE 0;

-- DESIGN.md rule 2, one key per row: a pending key keeps the earlier ready
-- time (never earlier than its backoff unless `bypass_backoff`, which also
-- clears the backoff) and the higher priority; a parked or idle key becomes
-- pending (pending since now); a running key is marked dirty, remembering the
-- earliest ready time and highest priority asked for. Every key counts the
-- enqueue. A bad name aborts the statement (and so the caller's change).
CREATE TRIGGER drover_enqueue_row INSTEAD OF INSERT ON drover_enqueue
BEGIN
    SELECT RAISE(ABORT, 'drover_enqueue: a process name is text of 1 to 1024 bytes')
    WHERE typeof(NEW.process) <> 'text' OR length(CAST(NEW.process AS BLOB)) NOT BETWEEN 1 AND 1024
       OR instr(CAST(NEW.process AS BLOB), x'00') > 0;
    SELECT RAISE(ABORT, 'drover_enqueue: a key is text of 1 to 1024 bytes without NUL')
    WHERE typeof(NEW.key) <> 'text' OR length(CAST(NEW.key AS BLOB)) NOT BETWEEN 1 AND 1024
       OR instr(CAST(NEW.key AS BLOB), x'00') > 0;
    INSERT INTO drover_processes (process, created_at)
    VALUES (NEW.process, CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
                         + COALESCE(NEW.clock_offset_ms, 0))
    ON CONFLICT (process) DO NOTHING;
    INSERT INTO drover_items (process, key, state, priority, ready_at, enqueued_at,
        first_enqueued_at, last_enqueued_at, enqueue_count)
    SELECT NEW.process, NEW.key, 'pending', COALESCE(NEW.priority, 0),
        t.now + MAX(COALESCE(NEW.delay_ms, 0), 0), t.now, t.now, t.now, 1
    FROM (SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
                 + COALESCE(NEW.clock_offset_ms, 0) AS now) AS t
    WHERE true
    ON CONFLICT (process, key) DO UPDATE SET
      priority = CASE drover_items.state WHEN 'pending' THEN MAX(drover_items.priority, excluded.priority)
                              WHEN 'running' THEN drover_items.priority ELSE excluded.priority END,
      ready_at = CASE drover_items.state
          WHEN 'pending' THEN MIN(drover_items.ready_at, CASE WHEN COALESCE(NEW.bypass_backoff, 0)
              THEN excluded.ready_at
              ELSE MAX(excluded.ready_at, COALESCE(drover_items.backoff_until, excluded.ready_at)) END)
          WHEN 'running' THEN drover_items.ready_at ELSE excluded.ready_at END,
      enqueued_at = CASE drover_items.state WHEN 'parked' THEN excluded.enqueued_at
                                 WHEN 'idle' THEN excluded.enqueued_at ELSE drover_items.enqueued_at END,
      backoff_until = CASE WHEN COALESCE(NEW.bypass_backoff, 0) AND drover_items.state = 'pending'
                           THEN NULL ELSE drover_items.backoff_until END,
      dirty_since = CASE drover_items.state WHEN 'running'
          THEN COALESCE(drover_items.dirty_since, excluded.enqueued_at) ELSE drover_items.dirty_since END,
      dirty_ready_at = CASE drover_items.state WHEN 'running'
          THEN MIN(COALESCE(drover_items.dirty_ready_at, excluded.ready_at), excluded.ready_at)
          ELSE drover_items.dirty_ready_at END,
      dirty_priority = CASE drover_items.state WHEN 'running'
          THEN MAX(COALESCE(drover_items.dirty_priority, excluded.priority), excluded.priority)
          ELSE drover_items.dirty_priority END,
      first_enqueued_at = COALESCE(drover_items.first_enqueued_at, excluded.enqueued_at),
      last_enqueued_at = excluded.enqueued_at,
      enqueue_count = drover_items.enqueue_count + 1,
      state = CASE drover_items.state WHEN 'running' THEN 'running' ELSE 'pending' END;
END;

-- Which tables are watched: each insert, update and delete of a row of
-- `relation` enqueues the row's `key_column` (old and new value) to
-- `process`, through the triggers `drover_watch_<id>_insert|update|delete`.
-- `columns` (a JSON array): when set, an update that changes none of them
-- enqueues nothing.
CREATE TABLE drover_watches (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    relation   TEXT    NOT NULL UNIQUE,
    process    TEXT    NOT NULL,
    key_column TEXT    NOT NULL,
    columns    TEXT,
    created_at INTEGER NOT NULL
);

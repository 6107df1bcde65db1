-- The SQL enqueue takes an optional trace context (issue 38: "the SQL
-- enqueue accepts an optional context argument"), a column of the view:
--
--     INSERT INTO drover_enqueue (process, key, context)
--     VALUES ('provision', 'm-42', '00-<trace id>-<span id>-01');
--
-- links the context to the key's next run in the same statement, as an
-- insert into `drover_trace_link` after it does (which still works): the
-- same check (migration 0022: a context that is not W3C is ignored, the key
-- stays enqueued) and the same cap. A view's columns cannot be added in
-- place, and dropping the view drops its trigger: both are made again, the
-- trigger as migration 0021 left it with the link added at its end. Every
-- insert into the view names its columns, so the new one changes no caller.
DROP VIEW drover_enqueue;
CREATE VIEW drover_enqueue AS
SELECT CAST(NULL AS TEXT) AS process, CAST(NULL AS TEXT) AS key,
       0 AS priority, 0 AS delay_ms, 0 AS bypass_backoff, 0 AS clock_offset_ms,
       CAST(NULL AS TEXT) AS context
WHERE 0;

CREATE TRIGGER drover_enqueue_row INSTEAD OF INSERT ON drover_enqueue
BEGIN
    SELECT RAISE(ABORT, 'drover_enqueue: a process name is text of 1 to 1024 bytes')
    WHERE typeof(NEW.process) <> 'text' OR length(CAST(NEW.process AS BLOB)) NOT BETWEEN 1 AND 1024
       OR instr(CAST(NEW.process AS BLOB), x'00') > 0;
    SELECT RAISE(ABORT, 'drover_enqueue: a key is text of 1 to 1024 bytes without NUL')
    WHERE typeof(NEW.key) <> 'text' OR length(CAST(NEW.key AS BLOB)) NOT BETWEEN 1 AND 1024
       OR instr(CAST(NEW.key AS BLOB), x'00') > 0;
    SELECT RAISE(ABORT, 'drover_enqueue: a process name and a key must be valid UTF-8 text')
    WHERE (NEW.process GLOB '*[^ -~]*' OR NEW.key GLOB '*[^ -~]*') AND EXISTS (
        WITH RECURSIVE
            name(t) AS (VALUES (NEW.process), (NEW.key)),
            c(t, i) AS (
                SELECT t, 1 FROM name WHERE t GLOB '*[^ -~]*'
                UNION ALL SELECT t, i + 1 FROM c WHERE i < length(t))
        SELECT 1 FROM c
        WHERE (unicode(substr(t, i, 1)) > 1114111
               OR CAST(char(unicode(substr(t, i, 1))) AS BLOB) IS NOT CAST(substr(t, i, 1) AS BLOB))
          AND CAST(substr(t, i, 1) AS BLOB) NOT IN (x'EFBFBE', x'EFBFBF'));
    INSERT INTO drover_processes (process, created_at)
    VALUES (NEW.process, CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
                         + COALESCE(NEW.clock_offset_ms, 0))
    ON CONFLICT (process) DO NOTHING;
    UPDATE drover_items
    SET last_enqueued_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
                           + COALESCE(NEW.clock_offset_ms, 0),
        enqueue_count = enqueue_count + 1
    WHERE process = NEW.process AND key = NEW.key AND state = 'pending'
      AND priority >= COALESCE(NEW.priority, 0)
      AND first_enqueued_at IS NOT NULL
      AND (backoff_until IS NULL OR NOT COALESCE(NEW.bypass_backoff, 0))
      AND ready_at <= MAX(CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
                          + COALESCE(NEW.clock_offset_ms, 0) + MAX(COALESCE(NEW.delay_ms, 0), 0),
                          COALESCE(backoff_until, 0));
    -- changes(): rows the UPDATE just above changed (inside a trigger it
    -- counts the trigger's own last statement), so 1 when the fast path did
    -- the enqueue.
    INSERT INTO drover_items (process, key, state, priority, ready_at, enqueued_at,
        first_enqueued_at, last_enqueued_at, enqueue_count)
    SELECT NEW.process, NEW.key, 'pending', COALESCE(NEW.priority, 0),
        t.now + MAX(COALESCE(NEW.delay_ms, 0), 0), t.now, t.now, t.now, 1
    FROM (SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
                 + COALESCE(NEW.clock_offset_ms, 0) AS now) AS t
    WHERE changes() = 0
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
    -- The context, checked and capped by the view of migrations 0020 and
    -- 0022 (a trigger may insert into another view: its trigger fires).
    INSERT INTO drover_trace_link (process, key, context)
    SELECT NEW.process, NEW.key, NEW.context WHERE NEW.context IS NOT NULL;
END;

-- The SQL enqueue checks its numbers. The view `drover_enqueue` (migration
-- 0023) stored `priority`, `delay_ms` and `clock_offset_ms` as given: a
-- priority past an i32 (5000000000), text ('high'), a fraction (1.5) or a
-- delay of 0.5 ms (a REAL ready time), or a delay that overflowed the ready
-- time into a REAL, was written into `drover_items`. A claim then committed
-- the key's lease and failed to read the row back (a priority is an i32, a
-- time an i64), so the caller got an error while that key, and the valid
-- keys claimed with it, stayed running under a live session: lost until the
-- session ended. On a limited process every claim of the process failed,
-- and the item lists failed to read the row.
--
-- The trigger is made again as migration 0023 left it, with four checks at
-- its start; each fails the statement with one line and writes nothing.
-- NULL still means the default, as before (0, no delay, false, no offset).
--   priority         an integer from -2147483648 to 2147483647: the Rust
--                    API's i32 and PostgreSQL's `integer` parameter.
--   delay_ms         an integer of at most 15552000000 (180 days): the most
--                    the Rust API schedules (`backoff::MAX_DELAY`, to which
--                    it clamps any delay) and the HTTP API takes (`after_ms`);
--                    the ready time can no longer overflow into a REAL.
--                    A negative delay still means none, as it does on
--                    PostgreSQL (`GREATEST(delay_ms, 0)`) and as it did here.
--   bypass_backoff   0 or 1 (false or true; SQLite's TRUE and FALSE are 1
--                    and 0): what the Rust API binds, PostgreSQL's boolean.
--   clock_offset_ms  an integer from -10^15 to 10^15 (about 31,700 years
--                    either way; the store fills it with its test clock's
--                    offset, other programs leave it out), so no time the
--                    trigger computes overflows into a REAL.
-- Text and bytes are refused, even text of digits ('5'): a number is bound
-- as a number. A REAL with no fraction (7.0, 1e3) is taken as the integer it
-- is, as the HTTP API takes `7.0`: some clients bind every number as a
-- double (JavaScript's), and the columns' INTEGER affinity stores it as an
-- integer (every sum the trigger makes of such numbers stays below 2^53, so
-- it is exact). A REAL with a fraction, an infinity or one past the range
-- is refused.
DROP TRIGGER drover_enqueue_row;
CREATE TRIGGER drover_enqueue_row INSTEAD OF INSERT ON drover_enqueue
BEGIN
    SELECT RAISE(ABORT, 'drover_enqueue: a priority is an integer from -2147483648 to 2147483647')
    WHERE NEW.priority IS NOT NULL
      AND NOT (typeof(NEW.priority) IN ('integer', 'real')
               AND NEW.priority = CAST(NEW.priority AS INTEGER)
               AND NEW.priority BETWEEN -2147483648 AND 2147483647);
    SELECT RAISE(ABORT, 'drover_enqueue: delay_ms is an integer of milliseconds, at most 15552000000 (180 days)')
    WHERE NEW.delay_ms IS NOT NULL
      AND NOT (typeof(NEW.delay_ms) IN ('integer', 'real')
               AND NEW.delay_ms = CAST(NEW.delay_ms AS INTEGER)
               AND NEW.delay_ms <= 15552000000);
    SELECT RAISE(ABORT, 'drover_enqueue: bypass_backoff is 0 or 1 (false or true)')
    WHERE NEW.bypass_backoff IS NOT NULL
      AND NOT (typeof(NEW.bypass_backoff) IN ('integer', 'real') AND NEW.bypass_backoff IN (0, 1));
    SELECT RAISE(ABORT, 'drover_enqueue: clock_offset_ms is an integer of milliseconds from -10^15 to 10^15')
    WHERE NEW.clock_offset_ms IS NOT NULL
      AND NOT (typeof(NEW.clock_offset_ms) IN ('integer', 'real')
               AND NEW.clock_offset_ms = CAST(NEW.clock_offset_ms AS INTEGER)
               AND NEW.clock_offset_ms BETWEEN -1000000000000000 AND 1000000000000000);
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

-- The rows the old trigger let in, made readable. Only these columns ever
-- held what the view was given (the claim, the completions and the settings
-- write their numbers from Rust), and only rows with a bad value in one of
-- them are written. A priority that is a number is cut to an integer
-- (toward zero) and clamped to the i32 range, so a key asked for at
-- 5000000000 still goes first; one that is no number at all (text or bytes
-- written straight into the table: numeric text is stored as a number) is 0,
-- the priority of an enqueue that gives none. A time that is a REAL is cut
-- to an integer (a millisecond at most; one past the range of an i64, a
-- delay that overflowed, becomes the latest time, which the store reads as
-- the latest it can show: the key waits as it was asked to, and an enqueue
-- without that delay brings it back). A time that is no number at all
-- becomes the migration's time: such a ready time compared as later than
-- every number, so the key could never be claimed; now it can, at once,
-- as after an enqueue without a delay. A NULL stays NULL.
-- Only columns other than `state` change, so the counts' trigger (AFTER
-- UPDATE OF state) does not fire and the counts stay as they are.
UPDATE drover_items SET
    priority = CASE WHEN typeof(priority) IN ('integer', 'real')
        THEN MIN(MAX(CAST(priority AS INTEGER), -2147483648), 2147483647) ELSE 0 END,
    dirty_priority = CASE WHEN typeof(dirty_priority) IN ('integer', 'real')
        THEN MIN(MAX(CAST(dirty_priority AS INTEGER), -2147483648), 2147483647)
        WHEN dirty_priority IS NULL THEN NULL ELSE 0 END,
    ready_at = CASE typeof(ready_at) WHEN 'integer' THEN ready_at
        WHEN 'real' THEN CAST(ready_at AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END,
    enqueued_at = CASE typeof(enqueued_at) WHEN 'integer' THEN enqueued_at
        WHEN 'real' THEN CAST(enqueued_at AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END,
    first_enqueued_at = CASE typeof(first_enqueued_at) WHEN 'integer' THEN first_enqueued_at
        WHEN 'null' THEN NULL WHEN 'real' THEN CAST(first_enqueued_at AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END,
    last_enqueued_at = CASE typeof(last_enqueued_at) WHEN 'integer' THEN last_enqueued_at
        WHEN 'null' THEN NULL WHEN 'real' THEN CAST(last_enqueued_at AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END,
    dirty_since = CASE typeof(dirty_since) WHEN 'integer' THEN dirty_since
        WHEN 'null' THEN NULL WHEN 'real' THEN CAST(dirty_since AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END,
    dirty_ready_at = CASE typeof(dirty_ready_at) WHEN 'integer' THEN dirty_ready_at
        WHEN 'null' THEN NULL WHEN 'real' THEN CAST(dirty_ready_at AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END,
    backoff_until = CASE typeof(backoff_until) WHEN 'integer' THEN backoff_until
        WHEN 'null' THEN NULL WHEN 'real' THEN CAST(backoff_until AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END
WHERE typeof(priority) <> 'integer' OR priority NOT BETWEEN -2147483648 AND 2147483647
   OR typeof(dirty_priority) NOT IN ('integer', 'null')
   OR dirty_priority NOT BETWEEN -2147483648 AND 2147483647
   OR typeof(ready_at) <> 'integer' OR typeof(enqueued_at) <> 'integer'
   OR typeof(first_enqueued_at) NOT IN ('integer', 'null')
   OR typeof(last_enqueued_at) NOT IN ('integer', 'null')
   OR typeof(dirty_since) NOT IN ('integer', 'null')
   OR typeof(dirty_ready_at) NOT IN ('integer', 'null')
   OR typeof(backoff_until) NOT IN ('integer', 'null');

-- A process first named with a REAL clock offset was made at a REAL time.
UPDATE drover_processes SET
    created_at = CASE typeof(created_at) WHEN 'real' THEN CAST(created_at AS INTEGER)
        ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END
WHERE typeof(created_at) <> 'integer';

-- A run copies its item's `enqueued_at` (`pending_since`): a lease lost as
-- above and ended with its session recorded the REAL one. Nullable: a
-- pending time that is no number is not known.
UPDATE drover_runs SET
    pending_since = CASE typeof(pending_since) WHEN 'real' THEN CAST(pending_since AS INTEGER)
        ELSE NULL END
WHERE typeof(pending_since) NOT IN ('integer', 'null');

-- drover's durable store on SQLite. Times are integer milliseconds since the Unix
-- epoch on the database clock; every table is prefixed `drover_`.

-- One row per known process: its backoff policy.
CREATE TABLE drover_processes (
    process            TEXT    PRIMARY KEY,
    backoff_initial_ms INTEGER NOT NULL DEFAULT 1000,
    backoff_factor     REAL    NOT NULL DEFAULT 2.0,
    backoff_max_ms     INTEGER NOT NULL DEFAULT 360000,
    backoff_jitter     REAL    NOT NULL DEFAULT 0.0,
    created_at         INTEGER NOT NULL
);

-- Live workers. AUTOINCREMENT: an id is never reused, so a dead session's id can
-- never be mistaken for a new one.
CREATE TABLE drover_sessions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    component    TEXT    NOT NULL,
    ttl_ms       INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    deadline     INTEGER NOT NULL
);
CREATE INDEX drover_sessions_deadline ON drover_sessions (deadline);

-- One row per (process, key) that is pending, running or parked.
CREATE TABLE drover_items (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    process        TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'parked')),
    priority       INTEGER NOT NULL DEFAULT 0,
    ready_at       INTEGER NOT NULL,
    enqueued_at    INTEGER NOT NULL,
    failures       INTEGER NOT NULL DEFAULT 0,
    backoff_until  INTEGER,
    backoff_ms     INTEGER,
    last_error     TEXT,
    dirty_since    INTEGER,
    dirty_ready_at INTEGER,
    dirty_priority INTEGER,
    lease_session  INTEGER,
    lease_token    INTEGER,
    started_at     INTEGER,
    UNIQUE (process, key)
);
-- The claim: highest priority, then earliest ready time, then FIFO.
CREATE INDEX drover_items_claim
    ON drover_items (process, priority DESC, ready_at, id) WHERE state = 'pending';
CREATE INDEX drover_items_leases
    ON drover_items (lease_session) WHERE state = 'running';
CREATE INDEX drover_items_state ON drover_items (process, state, key);

-- Append-only event log, pruned by age.
CREATE TABLE drover_history (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        INTEGER NOT NULL,
    process   TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    event     TEXT    NOT NULL,
    session   INTEGER,
    token     INTEGER,
    attempt   INTEGER,
    error     TEXT,
    transient INTEGER
);
CREATE INDEX drover_history_key ON drover_history (process, key, id);
CREATE INDEX drover_history_at ON drover_history (at);

-- Monotonic counters; `lease_token` hands out fencing tokens.
CREATE TABLE drover_counters (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO drover_counters (name, value) VALUES ('lease_token', 0);

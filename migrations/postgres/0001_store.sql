-- drover's durable store on PostgreSQL. Every table is prefixed `drover_`; times
-- come from the database clock. Keys and process names are opaque: they compare
-- byte by byte (COLLATE "C"), as on SQLite, whatever the database's locale.

-- One row per known process: its backoff policy.
CREATE TABLE drover_processes (
    process            TEXT COLLATE "C" PRIMARY KEY,
    backoff_initial_ms BIGINT           NOT NULL DEFAULT 1000,
    backoff_factor     DOUBLE PRECISION NOT NULL DEFAULT 2.0,
    backoff_max_ms     BIGINT           NOT NULL DEFAULT 360000,
    backoff_jitter     DOUBLE PRECISION NOT NULL DEFAULT 0.0,
    created_at         TIMESTAMPTZ      NOT NULL
);

-- Live workers; identity ids are never reused.
CREATE TABLE drover_sessions (
    id           BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    component    TEXT        NOT NULL,
    ttl_ms       BIGINT      NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    deadline     TIMESTAMPTZ NOT NULL
);
CREATE INDEX drover_sessions_deadline ON drover_sessions (deadline);

-- One row per (process, key) that is pending, running or parked.
CREATE TABLE drover_items (
    id             BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    process        TEXT COLLATE "C" NOT NULL,
    key            TEXT COLLATE "C" NOT NULL,
    state          TEXT        NOT NULL CHECK (state IN ('pending', 'running', 'parked')),
    priority       INTEGER     NOT NULL DEFAULT 0,
    ready_at       TIMESTAMPTZ NOT NULL,
    enqueued_at    TIMESTAMPTZ NOT NULL,
    failures       INTEGER     NOT NULL DEFAULT 0,
    backoff_until  TIMESTAMPTZ,
    backoff_ms     BIGINT,
    last_error     TEXT,
    dirty_since    TIMESTAMPTZ,
    dirty_ready_at TIMESTAMPTZ,
    dirty_priority INTEGER,
    lease_session  BIGINT,
    lease_token    BIGINT,
    started_at     TIMESTAMPTZ,
    UNIQUE (process, key)
);
-- The claim: highest priority, then earliest ready time, then FIFO; O(log n).
CREATE INDEX drover_items_claim
    ON drover_items (process, priority DESC, ready_at, id) WHERE state = 'pending';
CREATE INDEX drover_items_leases
    ON drover_items (lease_session) WHERE state = 'running';
CREATE INDEX drover_items_state ON drover_items (process, state, key);

-- Append-only event log, pruned by age.
CREATE TABLE drover_history (
    id        BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        TIMESTAMPTZ NOT NULL,
    process   TEXT COLLATE "C" NOT NULL,
    key       TEXT COLLATE "C" NOT NULL,
    event     TEXT        NOT NULL,
    session   BIGINT,
    token     BIGINT,
    attempt   INTEGER,
    error     TEXT,
    transient BOOLEAN
);
CREATE INDEX drover_history_key ON drover_history (process, key, id);
CREATE INDEX drover_history_at ON drover_history (at);

-- Fencing tokens: strictly increasing across every lease ever handed out.
CREATE SEQUENCE drover_lease_tokens;

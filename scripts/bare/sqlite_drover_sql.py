#!/usr/bin/env python3
"""drover's own SQLite statements in a bare loop: what the schema costs, apart
from the framework (sqlx, tokio, the runs themselves).

The same drain as `sqlite.py` (100,000 keys, claims of 1,024, a transaction per
step, WAL, synchronous=FULL, drover's page size and cache) on a file migrated
with drover's own migrations, running the statements a burn-down runs: the
claim (`src/store/sqlite/leases.rs`: session check, ready rows, tokens, START,
counts) and the completion of clean `done` outcomes
(`src/store/sqlite/complete.rs`: sessions, QUICK, `runs.rs` LOG_FROM_ROWS,
IDLE, counts). The statements are copied here: keep them in step when those
files change. The one difference: drover's first statement of each (its
OPENING) also reads the database clock, and a claim's the process's gate
columns and top pending priority; here the time is fixed and only the
session is read, since Python's SQLite may predate `unixepoch('subsec')`. Prints `drain KEYS_PER_S` and the seconds spent in each step.

    python3 scripts/bare/sqlite_drover_sql.py [PATH]   (default /tmp/drover-sql.db, replaced)

`DROVER_BARE_KEYS` and `DROVER_BARE_FILL_ONLY` as in `sqlite.py`.

`DROVER_BARE_WITHOUT` (a comma-separated list) takes pieces of the schema or of
the loop away, to price each: `count_trigger` (migration 0011's trigger; the
counts are then wrong for other writers), `ended_index` (the runs' end-time
index that retention and the dashboard's chart read), `partial_indexes` (the
parked and backing-off rows' indexes, which each claim and completion must
test), `claim_commit` (a claim and the completion after it in one transaction,
one commit per cycle instead of two), `lease_index` (the index of running rows by
lease; the completion then finds each row by its key, which its batch carries, and
a session's reclaim would have to walk the running rows). None of these is a change drover has
made; they bound what it could gain by making them.
"""

import glob
import json
import os
import sqlite3
import sys
import time

from fresh import fresh

N = int(os.environ.get("DROVER_BARE_KEYS", "100000"))
CLAIM, NOW, PROCESS, SESSION = 1_024, 1_000_000, "p", 1
MIGRATIONS = os.path.join(os.path.dirname(__file__), "..", "..", "migrations", "sqlite")
WITHOUT = {piece for piece in os.environ.get("DROVER_BARE_WITHOUT", "").split(",") if piece}
DROPS = {
    "count_trigger": ("DROP TRIGGER drover_items_counted_update",),
    "ended_index": ("DROP INDEX drover_runs_ended",),
    "partial_indexes": ("DROP INDEX drover_items_parked_errors", "DROP INDEX drover_items_backoff",
                        "DROP INDEX drover_items_parked"),
    "claim_commit": (),
    "lease_index": ("DROP INDEX drover_items_leases",),
}

START = """UPDATE drover_items SET state = 'running', lease_session = ?2,
    lease_token = ?3 + id, started_at = ?4, counts_mark = counts_mark + 1
WHERE id IN (SELECT value FROM json_each(?1)) AND +state = 'pending' AND +process = ?5"""
READY = """SELECT json_group_array(json_array(ready_at, id, key, failures, enqueued_at))
FROM (SELECT id, key, failures, enqueued_at, ready_at FROM drover_items
      WHERE process = ?1 AND state = 'pending' AND priority = ?2 AND ready_at <= ?3
      ORDER BY ready_at, id LIMIT ?4)"""
QUICK = """SELECT json_group_array(json_array(i.lease_token, i.id, i.key))
FROM json_each(?1) AS j CROSS JOIN drover_items AS i
    ON i.lease_session = ?2 AND i.lease_token = j.value
WHERE i.state = 'running' AND +i.process = ?3 AND i.dirty_since IS NULL"""
QUICK_BY_KEY = """SELECT json_group_array(json_array(i.lease_token, i.id, i.key))
FROM json_each(?1) AS j CROSS JOIN drover_items AS i
    ON i.process = ?3 AND i.key = j.value
WHERE i.state = 'running' AND i.lease_session = ?2 AND i.dirty_since IS NULL"""
LOG = """INSERT INTO drover_runs (process, key, outcome, attempt, session, token, pending_since,
    started_at, ended_at)
SELECT process, key, ?2, failures + 1, lease_session, lease_token, enqueued_at, started_at, ?1
FROM drover_items WHERE id IN (SELECT value FROM json_each(?3)) ORDER BY lease_token"""
IDLE = """UPDATE drover_items SET state = 'idle', ready_at = ?1, failures = 0,
    backoff_until = NULL, backoff_ms = NULL, last_error = NULL, error_signature = NULL,
    lease_session = NULL, lease_token = NULL, started_at = NULL,
    last_outcome = 'done', last_ended_at = ?1, counts_mark = counts_mark + 1
WHERE id IN (SELECT value FROM json_each(?2)) AND +state = 'running' AND +process = ?3"""
SHIFT = """UPDATE drover_item_counts SET n = n + CASE state WHEN ?3 THEN ?4 ELSE -?4 END
WHERE process = ?1 AND state IN (?2, ?3)"""


def open_db(path: str) -> sqlite3.Connection:
    c = fresh(path)
    for migration in sorted(glob.glob(os.path.join(MIGRATIONS, "*.sql"))):
        c.executescript(open(migration).read())
    unknown = WITHOUT - DROPS.keys()
    if unknown:
        sys.exit(f"DROVER_BARE_WITHOUT: unknown {', '.join(sorted(unknown))}; known: {', '.join(DROPS)}")
    for piece in sorted(WITHOUT):
        for statement in DROPS[piece]:
            c.execute(statement)
    c.execute("INSERT INTO drover_processes (process, created_at) VALUES (?, 0)", (PROCESS,))
    c.execute("INSERT INTO drover_sessions (id, component, ttl_ms, started_at, heartbeat_at,"
              " deadline) VALUES (?, 'bare', 1, 0, 0, ?)", (SESSION, NOW * 10))
    c.execute("BEGIN")
    c.executemany("INSERT INTO drover_items (process, key, state, priority, ready_at,"
                  " enqueued_at) VALUES (?, ?, 'pending', 0, 0, 0)",
                  [(PROCESS, f"k{i}") for i in range(N)])
    c.execute("COMMIT")
    return c


def main() -> None:
    c = open_db(sys.argv[1] if len(sys.argv) > 1 else "/tmp/drover-sql.db")
    if os.environ.get("DROVER_BARE_FILL_ONLY"):
        return
    spent: dict[str, float] = {}

    def step(name, run):
        begun = time.perf_counter()
        result = run()
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - begun
        return result

    start = time.perf_counter()
    while True:
        c.execute("BEGIN IMMEDIATE")
        step("claim_session", lambda: c.execute(
            "SELECT 1 FROM drover_sessions WHERE id = ? AND deadline > ?", (SESSION, NOW)).fetchall())
        ready = step("claim_ids", lambda: [(id_, key, 0, failures, enqueued_at) for
                                           _, id_, key, failures, enqueued_at in sorted(json.loads(
                                               c.execute(READY, (PROCESS, 0, NOW, CLAIM)).fetchone()[0]))])
        if not ready:
            c.execute("COMMIT")
            break
        ids = [row[0] for row in ready]
        low, span = min(ids), max(ids) - min(ids) + 1
        last = step("claim_tokens", lambda: c.execute(
            "UPDATE drover_counters SET value = value + ? WHERE name = 'lease_token'"
            " RETURNING value", (span,)).fetchall()[0][0])
        base = last - span + 1 - low
        started = step("claim_start", lambda: c.execute(
            START, (json.dumps(ids), SESSION, base, NOW, PROCESS)).rowcount)
        assert started == len(ids)
        leases = [(key, base + id_) for id_, key, *_ in ready]
        step("claim_counts", lambda: c.execute(SHIFT, (PROCESS, "pending", "running", started)))
        if "claim_commit" not in WITHOUT:
            step("claim_commit", lambda: c.execute("COMMIT"))
            c.execute("BEGIN IMMEDIATE")
        step("done_sessions", lambda: c.execute(
            "SELECT id FROM drover_sessions WHERE id IN (SELECT value FROM json_each(?))"
            " AND deadline > ?", (json.dumps([SESSION]), NOW)).fetchall())
        keys = {token: key for key, token in leases}
        if "lease_index" in WITHOUT:
            found = step("done_quick", lambda: json.loads(c.execute(
                QUICK_BY_KEY, (json.dumps(list(keys.values())), SESSION, PROCESS)).fetchone()[0]))
        else:
            found = step("done_quick", lambda: json.loads(c.execute(
                QUICK, (json.dumps(list(keys)), SESSION, PROCESS)).fetchone()[0]))
        held = json.dumps([id_ for token, id_, key in found if keys[token] == key])
        step("done_runs", lambda: c.execute(LOG, (NOW, "done", held)))
        idle = step("done_idle", lambda: c.execute(IDLE, (NOW, held, PROCESS)).rowcount)
        step("done_counts", lambda: c.execute(SHIFT, (PROCESS, "running", "idle", idle)))
        step("done_commit", lambda: c.execute("COMMIT"))
    elapsed = time.perf_counter() - start
    runs = c.execute("SELECT count(*) FROM drover_runs").fetchone()[0]
    assert runs == N, f"{runs} runs for {N} keys"
    print(f"drain {N / elapsed:.0f}")
    print(" ".join(f"{name}={seconds:.3f}" for name, seconds in spent.items()))


if __name__ == "__main__":
    main()

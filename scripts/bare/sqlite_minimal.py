#!/usr/bin/env python3
"""The least issue 13 asks SQLite to write per key, in a bare loop: a lower
bound for drover's schema, next to `sqlite.py` (which forgets keys and logs a
four-column event) and `sqlite_drover_sql.py` (drover's own statements).

Kept: the item row stays (`idle`, last outcome and its time), its unique
`(process, key)` index, the claim index on pending rows, a fencing token from
one counter (the claim's base plus the row's id, as drover's), and one run row
per run with the issue's fields and the index of a key's runs. Left out,
unlike drover: sessions, counts, the lease index, the end-time
index of runs, priorities walked one by one, the error and backoff columns.
The same drain as the other two (claims of 1,024, a transaction per step, WAL,
synchronous=FULL, drover's pragmas). Prints `drain KEYS_PER_S`.

    python3 scripts/bare/sqlite_minimal.py [PATH]   (default /tmp/drover-minimal.db, replaced)

`DROVER_BARE_KEYS` and `DROVER_BARE_FILL_ONLY` as in `sqlite.py`.
"""

import json
import os
import sys
import time

from fresh import fresh

N = int(os.environ.get("DROVER_BARE_KEYS", "100000"))
CLAIM, NOW = 1_024, 1_000_000

SCHEMA = """
CREATE TABLE items (id INTEGER PRIMARY KEY, process TEXT NOT NULL, key TEXT NOT NULL,
    state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0, ready_at INTEGER NOT NULL,
    enqueued_at INTEGER NOT NULL, failures INTEGER NOT NULL DEFAULT 0, lease_session INTEGER,
    lease_token INTEGER, started_at INTEGER, last_outcome TEXT, last_ended_at INTEGER,
    UNIQUE (process, key));
CREATE INDEX items_claim ON items (process, priority DESC, ready_at, id) WHERE state = 'pending';
CREATE TABLE runs (id INTEGER PRIMARY KEY, process TEXT NOT NULL, key TEXT NOT NULL,
    outcome TEXT NOT NULL, attempt INTEGER, session INTEGER, token INTEGER,
    pending_since INTEGER, started_at INTEGER, ended_at INTEGER NOT NULL);
CREATE INDEX runs_key ON runs (process, key, id);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters VALUES ('lease_token', 0);
"""
READY = """SELECT id, key, priority, failures, enqueued_at FROM items WHERE process = 'p' AND state = 'pending' AND priority = 0
    AND ready_at <= ? ORDER BY ready_at, id LIMIT ?"""
START = """UPDATE items SET state = 'running', lease_session = 1, lease_token = ?2 + id,
    started_at = ?3
WHERE id IN (SELECT value FROM json_each(?1)) AND +state = 'pending'"""
HELD = """SELECT i.id FROM json_each(?1) AS j JOIN items AS i ON i.id = j.value ->> 0
WHERE i.state = 'running' AND i.lease_token = j.value ->> 1 AND i.lease_session = 1"""
LOG = """INSERT INTO runs (process, key, outcome, attempt, session, token, pending_since,
    started_at, ended_at)
SELECT process, key, 'done', failures + 1, lease_session, lease_token, enqueued_at, started_at, ?1
FROM items WHERE id IN (SELECT value FROM json_each(?2))"""
IDLE = """UPDATE items SET state = 'idle', lease_session = NULL, lease_token = NULL,
    started_at = NULL, last_outcome = 'done', last_ended_at = ?1
WHERE id IN (SELECT value FROM json_each(?2))"""


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/drover-minimal.db"
    c = fresh(path)
    c.executescript(SCHEMA)
    c.execute("BEGIN")
    c.executemany("INSERT INTO items (process, key, state, ready_at, enqueued_at)"
                  " VALUES ('p', ?, 'pending', 0, 0)", [(f"k{i}",) for i in range(N)])
    c.execute("COMMIT")
    if os.environ.get("DROVER_BARE_FILL_ONLY"):
        return
    start = time.perf_counter()
    while True:
        c.execute("BEGIN IMMEDIATE")
        ready = c.execute(READY, (NOW, CLAIM)).fetchall()
        if not ready:
            c.execute("COMMIT")
            break
        ids = [row[0] for row in ready]
        low, span = min(ids), max(ids) - min(ids) + 1
        last = c.execute("UPDATE counters SET value = value + ? WHERE name = 'lease_token'"
                         " RETURNING value", (span,)).fetchone()[0]
        base = last - span + 1 - low
        assert c.execute(START, (json.dumps(ids), base, NOW)).rowcount == len(ids)
        c.execute("COMMIT")
        c.execute("BEGIN IMMEDIATE")
        asked = json.dumps([[id_, base + id_] for id_ in ids])
        held = json.dumps([r[0] for r in c.execute(HELD, (asked,))])
        c.execute(LOG, (NOW, held))
        c.execute(IDLE, (NOW, held))
        c.execute("COMMIT")
    elapsed = time.perf_counter() - start
    runs = c.execute("SELECT count(*) FROM runs").fetchone()[0]
    assert runs == N, f"{runs} runs for {N} keys"
    print(f"drain {N / elapsed:.0f}")


if __name__ == "__main__":
    main()

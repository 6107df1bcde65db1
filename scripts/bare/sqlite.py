#!/usr/bin/env python3
"""Issue 6's bare SQLite loop, the yardstick of drover's SQLite figures.

No framework: one connection (Python's sqlite3, WAL, synchronous=FULL), 100,000
keys enqueued by upsert in batches of 10,000, then drained: claim 1,000 keys
bumping a fencing token, delete them by (key, token) with one history row each,
a transaction per step. Prints `enqueue KEYS_PER_S` and `drain KEYS_PER_S`.

    python3 scripts/bare/sqlite.py [PATH]   (default /tmp/drover-bare.db, replaced)

`DROVER_BARE_KEYS` changes the number of keys (a multiple of 10,000, or fewer);
`DROVER_BARE_FILL_ONLY=1` stops after the enqueue (`instructions.sh` subtracts
that run's instructions from a full one's).
"""

import os
import sys
import time

from fresh import fresh

N = int(os.environ.get("DROVER_BARE_KEYS", "100000"))
BATCH, CLAIM = min(10_000, N), 1_000


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/drover-bare.db"
    c = fresh(path, ("journal_mode=WAL", "synchronous=FULL"))
    c.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, key TEXT UNIQUE, state TEXT,"
              " token INTEGER, ready INTEGER)")
    c.execute("CREATE INDEX items_ready ON items (state, ready, id)")
    c.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, at INTEGER, key TEXT,"
              " event TEXT, token INTEGER)")
    start = time.perf_counter()
    for first in range(0, N, BATCH):
        c.execute("BEGIN")
        c.executemany(
            "INSERT INTO items (key, state, token, ready) VALUES (?, 'pending', 0, 0)"
            " ON CONFLICT (key) DO UPDATE SET ready = 0",
            [(f"k{i}",) for i in range(first, first + BATCH)])
        c.execute("COMMIT")
    print(f"enqueue {N / (time.perf_counter() - start):.0f}")
    if os.environ.get("DROVER_BARE_FILL_ONLY"):
        return
    start = time.perf_counter()
    while True:
        c.execute("BEGIN IMMEDIATE")
        rows = c.execute(
            "UPDATE items SET state = 'running', token = token + 1 WHERE id IN"
            " (SELECT id FROM items WHERE state = 'pending' ORDER BY ready, id LIMIT ?)"
            " RETURNING key, token", (CLAIM,)).fetchall()
        c.execute("COMMIT")
        if not rows:
            break
        c.execute("BEGIN IMMEDIATE")
        c.executemany("DELETE FROM items WHERE key = ? AND token = ?", rows)
        c.executemany("INSERT INTO history (at, key, event, token) VALUES (1, ?, 'done', ?)", rows)
        c.execute("COMMIT")
    print(f"drain {N / (time.perf_counter() - start):.0f}")


if __name__ == "__main__":
    main()

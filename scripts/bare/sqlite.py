#!/usr/bin/env python3
"""The bare SQLite loop, the yardstick of drover's SQLite figures (issues 6, 39).

The same loop, schema and statements as the shared yardstick
(`../shared/peers/ceiling_sqlite.py`), at the same speed: this loop's first
form (a text state, an index of every row on (state, ready time, id), a key
column of its own with a unique index) drained 202,638 and 224,438 keys/s
where the shared one drained 247,950 and 251,463 in the same two rounds, and
every ratio against it read too kind. No framework: one connection (WAL,
synchronous=FULL), N keys enqueued by an upsert keeping the earliest ready
time, in batches of 10,000, then drained: claim 1,000 keys from a partial
index of the pending ones, in (priority, ready time) order, bumping a fencing
token, then delete them by (key, token) and write one history row each, one
transaction per step. Prints `enqueue KEYS_PER_S` and `drain KEYS_PER_S`.

    python3 scripts/bare/sqlite.py [PATH]   (default /tmp/drover-bare.db, replaced)

`DROVER_BARE_KEYS` changes the number of keys;
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
    c.execute("CREATE TABLE items (process TEXT, key TEXT, state INT, ready_at INT,"
              " priority INT, token INT, attempts INT, PRIMARY KEY (process, key))")
    c.execute("CREATE INDEX pend ON items (process, priority DESC, ready_at) WHERE state = 0")
    c.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, process TEXT, key TEXT,"
              " event INT, at INT)")
    start = time.perf_counter()
    for first in range(0, N, BATCH):
        c.execute("BEGIN IMMEDIATE")
        c.executemany(
            "INSERT INTO items VALUES ('p', ?, 0, 0, 0, 0, 0) ON CONFLICT (process, key)"
            " DO UPDATE SET ready_at = min(items.ready_at, excluded.ready_at)",
            [(f"k{i}",) for i in range(first, min(first + BATCH, N))])
        c.execute("COMMIT")
    print(f"enqueue {N / (time.perf_counter() - start):.0f}")
    if os.environ.get("DROVER_BARE_FILL_ONLY"):
        return
    start = time.perf_counter()
    done = 0
    while True:
        c.execute("BEGIN IMMEDIATE")
        rows = c.execute(
            "UPDATE items SET state = 1, token = token + 1 WHERE rowid IN"
            " (SELECT rowid FROM items WHERE process = 'p' AND state = 0 AND ready_at <= 1"
            " ORDER BY priority DESC, ready_at LIMIT ?) RETURNING key, token",
            (CLAIM,)).fetchall()
        c.execute("COMMIT")
        if not rows:
            break
        c.execute("BEGIN IMMEDIATE")
        c.executemany("DELETE FROM items WHERE process = 'p' AND key = ? AND token = ?", rows)
        c.executemany("INSERT INTO history (process, key, event, at) VALUES ('p', ?, 1, 0)",
                      [(key,) for key, _ in rows])
        c.execute("COMMIT")
        done += len(rows)
    if done != N:
        sys.exit(f"drained {done} keys of {N}")
    print(f"drain {done / (time.perf_counter() - start):.0f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a state CHECK costs SQLite per row written, as migration 0012 found.

drover's items table with its indexes and triggers left out, 100,000 rows,
every row's state updated in batches of 1,024 (as a claim does), once for
each way of writing the items' state CHECK: the `IN` list migration 0003
wrote, the `OR`s migration 0012 writes, and none. Prints one line per way:

    CHECK name=state_check form=in_list us_per_row=2.71

    python3 scripts/bare/sqlite_check_cost.py [PATH]   (default /tmp/drover-check.db, replaced)
"""

import json
import sys
import time

from fresh import DROVER_PRAGMAS, fresh

N, BATCH = 100_000, 1_024
STATES = ("pending", "running", "parked", "idle")
FORMS = {
    "in_list": "CHECK (state IN ({}))".format(", ".join(f"'{s}'" for s in STATES)),
    "or": "CHECK ({})".format(" OR ".join(f"state = '{s}'" for s in STATES)),
    "none": "",
}


def table(check: str) -> str:
    return f"""CREATE TABLE drover_items (
        id INTEGER PRIMARY KEY AUTOINCREMENT, process TEXT NOT NULL, key TEXT NOT NULL,
        state TEXT NOT NULL {check}, priority INTEGER NOT NULL DEFAULT 0,
        ready_at INTEGER NOT NULL, enqueued_at INTEGER NOT NULL,
        failures INTEGER NOT NULL DEFAULT 0, backoff_until INTEGER, backoff_ms INTEGER,
        last_error TEXT, dirty_since INTEGER, dirty_ready_at INTEGER, dirty_priority INTEGER,
        lease_session INTEGER, lease_token INTEGER, started_at INTEGER,
        first_enqueued_at INTEGER, last_enqueued_at INTEGER,
        enqueue_count INTEGER NOT NULL DEFAULT 0, last_outcome TEXT, last_ended_at INTEGER,
        error_signature TEXT, counts_mark INTEGER NOT NULL DEFAULT 0, UNIQUE (process, key))"""


def us_per_row(path: str, check: str) -> float:
    c = fresh(path, DROVER_PRAGMAS[:4])
    c.execute(table(check))
    c.execute("BEGIN")
    c.executemany("INSERT INTO drover_items (process, key, state, ready_at, enqueued_at)"
                  " VALUES ('p', ?, 'pending', 0, 0)", [(f"k{i}",) for i in range(N)])
    c.execute("COMMIT")
    spent = 0.0
    for first in range(1, N + 1, BATCH):
        ids = json.dumps(list(range(first, min(first + BATCH, N + 1))))
        c.execute("BEGIN IMMEDIATE")
        begun = time.perf_counter()
        c.execute("UPDATE drover_items SET state = 'running'"
                  " WHERE id IN (SELECT value FROM json_each(?))", (ids,))
        spent += time.perf_counter() - begun
        c.execute("COMMIT")
    c.close()
    return spent / N * 1e6


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/drover-check.db"
    for form, check in FORMS.items():
        print(f"CHECK name=state_check form={form} us_per_row={us_per_row(path, check):.2f}")


if __name__ == "__main__":
    main()

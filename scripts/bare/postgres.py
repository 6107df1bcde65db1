#!/usr/bin/env python3
"""Issue 6's bare PostgreSQL loop, the yardstick of drover's PostgreSQL figures.

No framework: one connection (psycopg2), 100,000 keys enqueued by an upsert from
`unnest` in batches of 10,000, then drained: claim 1,000 keys with
`FOR UPDATE SKIP LOCKED` bumping a fencing token, delete them by (key, token)
writing a history row each, a transaction per step. Uses (and drops) the tables
`bare_items` and `bare_history`. Prints `enqueue KEYS_PER_S` and `drain KEYS_PER_S`.

    pip install psycopg2-binary
    python3 scripts/bare/postgres.py [DSN]   (default host=127.0.0.1 user=postgres dbname=test)
"""

import sys
import time

import psycopg2

N, BATCH, CLAIM = 100_000, 10_000, 1_000


def main() -> None:
    dsn = sys.argv[1] if len(sys.argv) > 1 else "host=127.0.0.1 user=postgres dbname=test"
    c = psycopg2.connect(dsn)
    cur = c.cursor()
    cur.execute("DROP TABLE IF EXISTS bare_items, bare_history")
    cur.execute("CREATE TABLE bare_items (id bigserial PRIMARY KEY, key text UNIQUE,"
                " state text, token bigint, ready bigint)")
    cur.execute("CREATE INDEX ON bare_items (ready, id) WHERE state = 'pending'")
    cur.execute("CREATE TABLE bare_history (id bigserial PRIMARY KEY, at bigint, key text,"
                " event text, token bigint)")
    c.commit()
    start = time.perf_counter()
    for first in range(0, N, BATCH):
        cur.execute(
            "INSERT INTO bare_items (key, state, token, ready)"
            " SELECT k, 'pending', 0, 0 FROM unnest(%s::text[]) k"
            " ON CONFLICT (key) DO UPDATE SET ready = 0",
            ([f"k{i}" for i in range(first, first + BATCH)],))
        c.commit()
    print(f"enqueue {N / (time.perf_counter() - start):.0f}")
    start = time.perf_counter()
    while True:
        cur.execute(
            "UPDATE bare_items SET state = 'running', token = token + 1 WHERE id IN"
            " (SELECT id FROM bare_items WHERE state = 'pending' ORDER BY ready, id"
            "  LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING key, token", (CLAIM,))
        rows = cur.fetchall()
        c.commit()
        if not rows:
            break
        cur.execute(
            "WITH d AS (DELETE FROM bare_items b USING unnest(%s::text[], %s::bigint[]) u(k, t)"
            " WHERE b.key = u.k AND b.token = u.t RETURNING b.key, b.token)"
            " INSERT INTO bare_history (at, key, event, token) SELECT 1, key, 'done', token FROM d",
            ([r[0] for r in rows], [r[1] for r in rows]))
        c.commit()
    print(f"drain {N / (time.perf_counter() - start):.0f}")
    cur.execute("DROP TABLE bare_items, bare_history")
    c.commit()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The bare PostgreSQL loop, the yardstick of drover's PostgreSQL figures (issue 39).

The same loop, schema and statements as the shared yardstick
(`../shared/peers/ceiling.py`), at the same speed: psycopg 3 sends every array
as a binary parameter (psycopg2 spelled each 1,000-key array out as SQL text,
which made the loop it replaced half as fast, 26,000 against 50,000-60,000
keys/s, and every ratio against it twice too kind). No framework, one
connection: 100,000 keys enqueued by an upsert from `unnest` in batches of
10,000 (keeping the earliest ready time), then drained: claim 1,000 keys with
`FOR UPDATE SKIP LOCKED` bumping a fencing token (one autocommit statement),
then delete them by (key, token) and write one history row each, in one
transaction. Uses (and drops) the schema `drover_bare`.

Prints `enqueue KEYS_PER_S` and `drain KEYS_PER_S`, then the write-ahead log
the drain wrote per key, counted as `drover bench` counts it (the whole
cluster's: run it on a quiet one): `drain_wal_bytes_per_key N` from the log's
insert position, and `drain_wal_records_per_key N` where the database has
`pg_walinspect` (`CREATE EXTENSION pg_walinspect`). A checkpoint during the
drain adds full-page images to the bytes, not to the records.

    pip install 'psycopg[binary]'
    python3 scripts/bare/postgres.py [URL]   (default postgres://postgres@127.0.0.1:5432/test)
"""

import sys
import time

import psycopg

N, BATCH, CLAIM = 100_000, 10_000, 1_000


def lsn(c: psycopg.Cursor) -> str:
    """The log's insert position now."""
    c.execute("SELECT pg_current_wal_insert_lsn()::text")
    return c.fetchone()[0]


def wal_since(c: psycopg.Cursor, start: str) -> tuple[int, int | None]:
    """The WAL bytes written since `start`, and its records where the database
    has pg_walinspect (as `drover bench` counts them)."""
    c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)::bigint,"
              " (SELECT quote_ident(n.nspname) FROM pg_proc p JOIN pg_namespace n"
              "  ON n.oid = p.pronamespace WHERE p.proname = 'pg_get_wal_stats' LIMIT 1)",
              (start,))
    written, schema = c.fetchone()
    if schema is None:
        return written, None
    c.execute(f"SELECT coalesce(sum(count), 0)::bigint FROM {schema}.pg_get_wal_stats("
              "%s::pg_lsn, pg_current_wal_flush_lsn())", (start,))
    return written, c.fetchone()[0]


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else "postgres://postgres@127.0.0.1:5432/test"
    conn = psycopg.connect(url, autocommit=True)
    c = conn.cursor(binary=True)
    c.execute("DROP SCHEMA IF EXISTS drover_bare CASCADE")
    c.execute("CREATE SCHEMA drover_bare")
    c.execute("SET search_path = drover_bare")
    c.execute("CREATE TABLE items (process text, key text, state int, ready_at bigint,"
              " priority int, token bigint, attempts int, PRIMARY KEY (process, key))")
    c.execute("CREATE INDEX pend ON items (process, priority DESC, ready_at) WHERE state = 0")
    c.execute("CREATE TABLE history (id bigserial PRIMARY KEY, process text, key text,"
              " event int, at bigint)")
    keys = [f"k{i}" for i in range(N)]
    start = time.perf_counter()
    for first in range(0, N, BATCH):
        c.execute("INSERT INTO items SELECT 'p', k, 0, 0, 0, 0, 0 FROM unnest(%s::text[]) k"
                  " ON CONFLICT (process, key)"
                  " DO UPDATE SET ready_at = least(items.ready_at, excluded.ready_at)",
                  (keys[first:first + BATCH],))
    print(f"enqueue {N / (time.perf_counter() - start):.0f}")
    mark = lsn(c)
    start = time.perf_counter()
    done = 0
    while True:
        c.execute("UPDATE items SET state = 1, token = token + 1 WHERE (process, key) IN"
                  " (SELECT process, key FROM items WHERE process = 'p' AND state = 0"
                  "  AND ready_at <= 1 ORDER BY priority DESC, ready_at LIMIT %s"
                  "  FOR UPDATE SKIP LOCKED) RETURNING key, token", (CLAIM,))
        rows = c.fetchall()
        if not rows:
            break
        with conn.transaction():
            c.execute("DELETE FROM items i USING unnest(%s::text[], %s::bigint[]) u(k, t)"
                      " WHERE i.process = 'p' AND i.key = u.k AND i.token = u.t",
                      ([r[0] for r in rows], [r[1] for r in rows]))
            c.execute("INSERT INTO history (process, key, event, at)"
                      " SELECT 'p', k, 1, 0 FROM unnest(%s::text[]) k", ([r[0] for r in rows],))
        done += len(rows)
    elapsed = time.perf_counter() - start
    written, records = wal_since(c, mark)
    print(f"drain {done / elapsed:.0f}")
    print(f"drain_wal_bytes_per_key {written / N:.0f}")
    if records is not None:
        print(f"drain_wal_records_per_key {records / N:.1f}")
    c.execute("DROP SCHEMA drover_bare CASCADE")


if __name__ == "__main__":
    main()

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

`DROVER_BARE_NODES=K` drains with K processes at once, each its own
connection claiming 1,000/K keys at a time (what `drover bench burn-down
--nodes K` does with the same total W): the drain then runs from the moment
all K start to the moment the last one finds nothing left to claim. It says
what the database and the machine give any client spread over K processes.
With `DROVER_BARE_LANES=1` as well, the keys are spread over K process names
(`p0`…) and each process drains its own name only: K clients that never meet
at the head of one queue.

Prints `enqueue KEYS_PER_S` and `drain KEYS_PER_S`, then the write-ahead log
the drain wrote per key, counted as `drover bench` counts it (the whole
cluster's: run it on a quiet one): `drain_wal_bytes_per_key N` from the log's
insert position, and `drain_wal_records_per_key N` where the database has
`pg_walinspect` (`CREATE EXTENSION pg_walinspect`). A checkpoint during the
drain adds full-page images to the bytes, not to the records.

    pip install 'psycopg[binary]'
    python3 scripts/bare/postgres.py [URL]   (default postgres://postgres@127.0.0.1:5432/test)
"""

import multiprocessing
import os
import queue
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


def drain(conn: psycopg.Connection, claim: int, process: str = "p") -> int:
    """Claims `claim` keys of `process` (`p`, or a lane's `pN`) at a time and
    completes them until none is left to claim; returns how many this
    connection drained."""
    assert process == "p" or (process[0] == "p" and process[1:].isdigit())
    c = conn.cursor(binary=True)
    done = 0
    while True:
        c.execute("UPDATE items SET state = 1, token = token + 1 WHERE (process, key) IN"
                  f" (SELECT process, key FROM items WHERE process = '{process}' AND state = 0"
                  "  AND ready_at <= 1 ORDER BY priority DESC, ready_at LIMIT %s"
                  "  FOR UPDATE SKIP LOCKED) RETURNING key, token", (claim,))
        rows = c.fetchall()
        if not rows:
            return done
        with conn.transaction():
            c.execute("DELETE FROM items i USING unnest(%s::text[], %s::bigint[]) u(k, t)"
                      f" WHERE i.process = '{process}' AND i.key = u.k AND i.token = u.t",
                      ([r[0] for r in rows], [r[1] for r in rows]))
            c.execute("INSERT INTO history (process, key, event, at)"
                      f" SELECT '{process}', k, 1, 0 FROM unnest(%s::text[]) k", ([r[0] for r in rows],))
        done += len(rows)


def node(url: str, claim: int, process: str, ready, results) -> None:
    """One of `DROVER_BARE_NODES` draining processes: connects, waits for the
    others, drains, and reports (keys, start, end)."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET search_path = drover_bare")
    ready.wait(timeout=60)
    start = time.monotonic()
    done = drain(conn, claim, process)
    results.put((done, start, time.monotonic()))
    conn.close()


def drain_in_processes(url: str, nodes: int, lanes: bool) -> tuple[int, float]:
    """Drains with `nodes` processes, each claiming CLAIM/nodes keys at a
    time (of its own lane's name, with `lanes`); returns the keys drained and
    the seconds from the first start to the last end."""
    ready = multiprocessing.Barrier(nodes)
    results = multiprocessing.Queue()
    workers = [multiprocessing.Process(
                   target=node,
                   args=(url, CLAIM // nodes, f"p{i}" if lanes else "p", ready, results))
               for i in range(nodes)]
    for w in workers:
        w.start()
    reports = []
    while len(reports) < nodes:
        try:
            reports.append(results.get(timeout=1))
        except queue.Empty:
            # A process that died reports nothing: do not wait for it for ever.
            if any(w.exitcode not in (None, 0) for w in workers):
                break
    for w in workers:
        w.join()
        if w.exitcode != 0:
            sys.exit(f"a draining process failed (exit {w.exitcode})")
    done = sum(r[0] for r in reports)
    return done, max(r[2] for r in reports) - min(r[1] for r in reports)


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
    nodes = int(os.environ.get("DROVER_BARE_NODES", "1"))
    lanes = nodes > 1 and os.environ.get("DROVER_BARE_LANES") == "1"
    # Key k{i} belongs to lane p{i mod K} when there are lanes.
    name = f"'p' || (substr(k, 2)::int %% {nodes})" if lanes else "'p'"
    keys = [f"k{i}" for i in range(N)]
    start = time.perf_counter()
    for first in range(0, N, BATCH):
        c.execute(f"INSERT INTO items SELECT {name}, k, 0, 0, 0, 0, 0 FROM unnest(%s::text[]) k"
                  " ON CONFLICT (process, key)"
                  " DO UPDATE SET ready_at = least(items.ready_at, excluded.ready_at)",
                  (keys[first:first + BATCH],))
    print(f"enqueue {N / (time.perf_counter() - start):.0f}")
    mark = lsn(c)
    if nodes == 1:
        start = time.perf_counter()
        done = drain(conn, CLAIM)
        elapsed = time.perf_counter() - start
    else:
        done, elapsed = drain_in_processes(url, nodes, lanes)
    if done != N:
        sys.exit(f"drained {done} keys of {N}")
    written, records = wal_since(c, mark)
    print(f"drain {done / elapsed:.0f}")
    print(f"drain_wal_bytes_per_key {written / N:.0f}")
    if records is not None:
        print(f"drain_wal_records_per_key {records / N:.1f}")
    c.execute("DROP SCHEMA drover_bare CASCADE")


if __name__ == "__main__":
    main()

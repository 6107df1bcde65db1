#!/usr/bin/env python3
"""Issue 13's performance targets in one run: drover beside the bare loops.

Each round runs, in this order, the bare SQLite loop, drover's SQLite enqueue
and burn-down, the bare PostgreSQL loop, drover's PostgreSQL enqueue and
burn-down (100,000 keys; enqueue in batches of 10,000 by one producer,
burn-down at W = 1024; SQLite files replaced before each run, a `VACUUM` of
the PostgreSQL database before each of drover's runs there). Figures on a
shared machine move by ±20 % from run to run, and a slow minute slows the bare
loop and drover alike, so a target is judged on the median of the per-round
ratios, not on one run. Prints one line per figure and round, then one per
figure with the median:

    BENCH name=side_by_side round=1 engine=sqlite figure=burn_down bare_keys_per_s=… drover_keys_per_s=… ratio=…
    BENCH name=side_by_side engine=sqlite figure=burn_down rounds=5 min_ratio=… median_ratio=… max_ratio=… target=0.6 met=yes

    cargo build --release
    python3 scripts/bare/side_by_side.py [ROUNDS]   (default 5)

`DROVER_BIN` names the binary (default target/release/drover),
`DROVER_BENCH_POSTGRES_URL` the database (default
postgres://postgres@127.0.0.1:5432/test; the bare loop uses and drops its own
tables there, drover a fresh process per run), `DROVER_BENCH_ENGINES` the
engines (default `sqlite,postgres`). Exits non-zero if a run fails; the verdict
on the targets is printed, not an exit status.
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("DROVER_BIN", "target/release/drover")
PG = os.environ.get("DROVER_BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
ENGINES = os.environ.get("DROVER_BENCH_ENGINES", "sqlite,postgres").split(",")
KEYS = 100_000

# Issue 13: drover's rate over the bare loop's, at least.
TARGETS = {
    ("sqlite", "enqueue"): 1.0,
    ("sqlite", "burn_down"): 0.6,
    ("postgres", "enqueue"): 1.0,
    ("postgres", "burn_down"): 0.8,
}


def run(argv: list[str]) -> str:
    """`argv`'s standard output; its standard error is shown only if it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"cannot run {argv[0]} ({e.strerror}): build it with `cargo build --release`"
                 " or name it in DROVER_BIN")
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def bare(engine: str, path: str) -> dict[str, float]:
    """The bare loop's `enqueue` and `drain` rates."""
    script = os.path.join(HERE, f"{engine}.py")
    argv = [sys.executable, script, path] if engine == "sqlite" else [sys.executable, script]
    rates = dict(line.split() for line in run(argv).splitlines() if line.strip())
    return {"enqueue": float(rates["enqueue"]), "burn_down": float(rates["drain"])}


def vacuum(url: str) -> None:
    """`VACUUM` of drover's database before a PostgreSQL run: the bare loop
    drops its tables each run, while drover's bench deletes its rows and keeps
    its tables, and on a database without autovacuum (this machine kind's)
    the dead rows of the runs before slowed each later one (a quarter over
    five rounds, session 28)."""
    import psycopg  # the bare PostgreSQL loop needs it too

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")


def drover(engine: str, scenario: str, db: str, extra: list[str]) -> float:
    """drover's keys per second for one `drover bench` scenario."""
    if engine == "postgres":
        vacuum(db)
    if engine == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(db.removeprefix("sqlite://") + suffix)
            except FileNotFoundError:
                pass
    out = run([BIN, "bench", scenario, "--db", db, "--keys", str(KEYS)] + extra)
    rates = re.findall(r"^BENCH .*\bkeys_per_s=([0-9.]+)", out, re.MULTILINE)
    if not rates:
        sys.exit(f"drover bench {scenario} printed no BENCH line:\n{out}")
    return float(rates[0])


def main() -> None:
    arg = sys.argv[1] if len(sys.argv) > 1 else "5"
    if not arg.isdigit() or int(arg) < 1:
        sys.exit(f"usage: side_by_side.py [ROUNDS]: ROUNDS is a whole number of 1 or more, not {arg!r}")
    rounds = int(arg)
    unknown = [e for e in ENGINES if e not in ("sqlite", "postgres")]
    if unknown:
        sys.exit(f"DROVER_BENCH_ENGINES names {', '.join(unknown)}: use sqlite, postgres or both")
    ratios: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="drover-side-by-side-") as tmp:
        for r in range(1, rounds + 1):
            for engine in ENGINES:
                if engine == "sqlite":
                    yardstick = bare(engine, os.path.join(tmp, "bare.db"))
                    db = "sqlite://" + os.path.join(tmp, "drover.db")
                else:
                    yardstick = bare(engine, PG)
                    db = PG
                ours = {
                    "enqueue": drover(engine, "enqueue", db, ["--workers", "1"]),
                    "burn_down": drover(engine, "burn-down", db, ["--workers", "1024"]),
                }
                for figure in ("enqueue", "burn_down"):
                    ratio = ours[figure] / yardstick[figure]
                    ratios.setdefault((engine, figure), []).append(ratio)
                    print(f"BENCH name=side_by_side round={r} engine={engine} figure={figure}"
                          f" bare_keys_per_s={yardstick[figure]:.0f}"
                          f" drover_keys_per_s={ours[figure]:.0f} ratio={ratio:.3f}", flush=True)
    for (engine, figure), values in ratios.items():
        target = TARGETS[(engine, figure)]
        median = statistics.median(values)
        print(f"BENCH name=side_by_side engine={engine} figure={figure} rounds={len(values)}"
              f" min_ratio={min(values):.3f} median_ratio={median:.3f} max_ratio={max(values):.3f}"
              f" target={target} met={'yes' if median >= target else 'no'}")


if __name__ == "__main__":
    main()

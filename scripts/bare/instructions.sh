#!/usr/bin/env bash
# Issue 13's SQLite burn-down in instructions per key, counted by valgrind
# (cachegrind), next to the bare loops: a yardstick that does not move with the
# machine's load, where wall-clock rounds on two shared cores vary by ±25 %.
# Instructions are not time (no I/O, no waiting, no second core), so this
# says where the work is, not how fast it runs.
#
#   scripts/bare/instructions.sh [KEYS]   (default 20000; needs valgrind and
#                                           target/release/drover, or the
#                                           binary in DROVER_BIN)
#
# Each Python loop runs twice, with and without its drain
# (DROVER_BARE_FILL_ONLY), and the difference is the drain's. drover's
# burn-down has no such switch: its line is `bench burn-down` at 2×KEYS
# minus at KEYS (fill, drain and clean-up of KEYS keys), less the same
# difference of `bench enqueue` (fill and clean-up), which leaves the drain
# plus the clean-up of the drained keys' idle rows and runs. `sqlite_share` is
# the part of one whole `bench burn-down` run (fill, drain, clean-up) spent
# inside SQLite (`sqlite3_step`, inclusive), from callgrind.
# DROVER_BARE_LOOPS picks the Python loops (`sqlite sqlite_drover_sql
# sqlite_minimal` by default; empty for none).
# Prints one line per figure:
#   IR name=burn_down loop=bare keys=20000 ir_per_key=42374
set -euo pipefail
cd "$(dirname "$0")/../.."
# drover's binary allocates with mimalloc (C's malloc too), which gives memory
# back to the OS on a timer: under valgrind's slowdown that is work in
# proportion to wall time, and the count varied by ±15 % from run to run.
export MIMALLOC_PURGE_DELAY=-1
keys=${1:-20000}
bin=${DROVER_BIN:-target/release/drover}
python=$(command -v python3)
if command -v pyenv >/dev/null; then python=$(pyenv which python3); fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ir() { # instructions of the command "$@"
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$@" 2>&1 >/dev/null |
    sed -n 's/.*I *refs: *//p' | tr -d ,
}

for loop in ${DROVER_BARE_LOOPS-sqlite sqlite_drover_sql sqlite_minimal}; do
  fill=$(DROVER_BARE_KEYS=$keys DROVER_BARE_FILL_ONLY=1 ir "$python" "scripts/bare/$loop.py" "$work/$loop.db")
  all=$(DROVER_BARE_KEYS=$keys ir "$python" "scripts/bare/$loop.py" "$work/$loop.db")
  name=${loop#sqlite_}; [ "$name" = sqlite ] && name=bare
  echo "IR name=burn_down loop=$name keys=$keys ir_per_key=$(( (all - fill) / keys ))"
done

drover() { # instructions of `drover bench SCENARIO` on N keys
  rm -f "$work"/d.db*
  ir "$bin" bench "$1" --db "sqlite://$work/d.db" --keys "$2" --workers "$3"
}
bd=$(( $(drover burn-down $((2 * keys)) 1024) - $(drover burn-down "$keys" 1024) ))
enq=$(( $(drover enqueue $((2 * keys)) 1) - $(drover enqueue "$keys" 1) ))
rm -f "$work"/d.db*
valgrind --tool=callgrind --callgrind-out-file="$work/cl.out" "$bin" bench \
  burn-down --db "sqlite://$work/d.db" --keys "$keys" --workers 1024 >/dev/null 2>&1
share=$(callgrind_annotate --inclusive=yes "$work/cl.out" 2>/dev/null | tr -d , |
  awk '/PROGRAM TOTALS/ {t = $1} /:sqlite3_step / {s = $1} END {printf "%.2f", s / t}')
echo "IR name=burn_down loop=drover keys=$keys ir_per_key=$(( (bd - enq) / keys )) sqlite_share=$share"

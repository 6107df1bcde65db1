#!/usr/bin/env bash
# The partition measurement of issue 11: ROUNDS rounds per TTL and cut, in
# which worker A is cut off while it and its command stay alive and worker B
# takes the key; each round's gap between A's last tick and B's first comes
# from the tick log the commands wrote. Three setups, each an ignored test:
#
#   direct           drover work --db, A's link to PostgreSQL cut
#   WorkerToServe    drover work --server, A's link to its drover serve cut
#   ServeToDatabase  drover work --server, its drover serve's link to
#                    PostgreSQL cut
#
# Prints one PARTITION line per setup, TTL and cut (rounds, overlaps, smallest
# and largest gap) and exits non-zero if any round overlapped.
#
#   DROVER_TEST_POSTGRES_URL=postgres://… scripts/partition-measure.sh
#   ROUNDS=20 TTLS="2s 10s" CUTS=freeze,reset scripts/partition-measure.sh
#   SETUPS="direct" scripts/partition-measure.sh
#
# DROVER_TEST_BIN=PATH runs that drover binary instead of the one cargo
# builds (a copy, so that rebuilds during a long run do not change it).
set -euo pipefail
cd "$(dirname "$0")/.."

: "${DROVER_TEST_POSTGRES_URL:?set DROVER_TEST_POSTGRES_URL to a PostgreSQL server}"
export DROVER_TEST_POSTGRES_URL
export DROVER_PARTITION_ROUNDS="${ROUNDS:-20}"
export DROVER_PARTITION_CUTS="${CUTS:-freeze}"
ttls="${TTLS:-2s 10s}"
setups="${SETUPS:-direct WorkerToServe ServeToDatabase}"

cargo test --no-run --test partition --test partition_server

status=0
for ttl in $ttls; do
  for setup in $setups; do
    case "$setup" in
      direct) args=(--test partition measure_drover_work_cut_off_from_the_database) ;;
      WorkerToServe) args=(--test partition_server measure_a_worker_cut_off_from_its_server) ;;
      ServeToDatabase) args=(--test partition_server measure_a_worker_whose_server_lost_the_database) ;;
      *) echo "unknown setup $setup" >&2; exit 2 ;;
    esac
    echo "== $setup, ttl $ttl, cuts $DROVER_PARTITION_CUTS, $DROVER_PARTITION_ROUNDS rounds" >&2
    DROVER_PARTITION_TTL="$ttl" cargo test -q "${args[@]}" -- --ignored --exact --nocapture \
      || status=1
  done
done
exit "$status"

#!/usr/bin/env bash
# Starts PgBouncer in transaction pooling mode on 127.0.0.1:6432 in front of
# the local PostgreSQL (scripts/pgbouncer/pgbouncer.ini), unless it already
# answers, and waits until it does. PgBouncer refuses to run as root: as root
# it runs as the `postgres` user. Its files live in /tmp/drover-pgbouncer.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir=/tmp/drover-pgbouncer
answers() { pg_isready -q -h 127.0.0.1 -p 6432 -U postgres -d test; }
if answers; then exit 0; fi
mkdir -p "$dir"
echo '"postgres" ""' > "$dir/userlist.txt"
cp "$here/pgbouncer.ini" "$dir/pgbouncer.ini"
user=()
if [ "$(id -u)" = 0 ]; then
  chown -R postgres "$dir"
  user=(-u postgres)
fi
pgbouncer -d "${user[@]}" "$dir/pgbouncer.ini"
for _ in $(seq 1 30); do
  answers && exit 0
  sleep 0.5
done
echo "PgBouncer did not answer on 127.0.0.1:6432; see $dir/pgbouncer.log" >&2
exit 1

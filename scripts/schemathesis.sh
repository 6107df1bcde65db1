#!/usr/bin/env bash
# Fuzzes drover's HTTP API with schemathesis (from PyPI) against its own
# /openapi.json: no response may be a 5xx, and every status, content type and
# body must match the document.
#
# Starts `drover serve` on a temporary SQLite file and a free loopback port,
# runs schemathesis, stops the server. Installs schemathesis into a virtualenv
# under the cargo target directory when it is not on PATH.
#
#   scripts/schemathesis.sh                # default budget
#   MAX_EXAMPLES=200 scripts/schemathesis.sh
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
max_examples="${MAX_EXAMPLES:-100}"

if command -v schemathesis >/dev/null; then
  st=schemathesis
else
  venv="$target/schemathesis-venv"
  if [ ! -x "$venv/bin/schemathesis" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet schemathesis
  fi
  st="$(cd "$venv/bin" && pwd)/schemathesis"
fi

cargo build --quiet --bin drover
tmp="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$target/debug/drover" serve --db "sqlite://$tmp/drover.db" --listen "127.0.0.1:$port" \
  --max-wait 2s >"$tmp/serve.log" 2>&1 &
server=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done

# From the temporary directory, so schemathesis's cache does not land in the repository.
# One worker: hypothesis calls `ast.parse` while drawing, and in CPython 3.11 before
# 3.11.8 the AST constructor's recursion counter is shared by the interpreter's threads
# and can fall out of step (python/cpython#106905). With two workers a CI run died with
# "AST constructor recursion depth mismatch": a crash of the tool, not a finding.
(cd "$tmp" && "$st" run "http://127.0.0.1:$port/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "$max_examples" \
  --workers 1 \
  --request-timeout 10 \
  --generation-database none \
  --suppress-health-check all \
  --no-color) || { echo "--- drover serve log:"; tail -50 "$tmp/serve.log"; exit 1; }

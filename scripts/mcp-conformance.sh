#!/usr/bin/env bash
# `make mcp-conformance`: the official MCP conformance suite
# (@modelcontextprotocol/conformance, pinned in
# services/mcp-server/testdata/conformance) in server mode against
# `brood mcp --listen` over streamable HTTP, on a fresh `brood dev` (free
# loopback ports, a temp data dir). It passes when every failing scenario is
# in the committed baseline (services/mcp-server/testdata/conformance-baseline.yml,
# each entry explained there) and no baseline entry passes.
set -euo pipefail
BIN=${1:-./bin/brood}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
HERE=$(cd "$(dirname "$0")/.." && pwd)
SUITE="$HERE/services/mcp-server/testdata/conformance"
BASELINE="$HERE/services/mcp-server/testdata/conformance-baseline.yml"
DATA=$(mktemp -d)
DEV="" MCP=""
cleanup() {
  for p in $MCP $DEV; do
    if kill -0 "$p" 2>/dev/null; then kill -INT "$p" 2>/dev/null || true; wait "$p" || true; fi
  done
  rm -rf "$DATA"
}
trap cleanup EXIT

# wait_for PATTERN FILE PID: the first match of PATTERN in FILE, within 30 s.
wait_for() {
  local got=""
  for _ in $(seq 1 600); do
    got=$(grep -o "$1" "$2" | head -1 || true)
    [ -n "$got" ] && { echo "$got"; return; }
    kill -0 "$3" 2>/dev/null || break
    sleep 0.05
  done
  cat "$2" "$2.err" >&2 2>/dev/null || true
  echo "no $1 in $2" >&2
  return 1
}

"$BIN" dev --data "$DATA/data" --listen 127.0.0.1:0 --log-level warn >"$DATA/dev.log" 2>"$DATA/dev.log.err" &
DEV=$!
NATS=$(wait_for 'nats://[0-9.]*:[0-9]*' "$DATA/dev.log" "$DEV")
"$BIN" mcp --nats "$NATS" --listen 127.0.0.1:0 --cwd "$DATA" >"$DATA/mcp.log" 2>"$DATA/mcp.log.err" &
MCP=$!
URL=$(wait_for 'http://[0-9.]*:[0-9]*/mcp' "$DATA/mcp.log" "$MCP")
cd "$SUITE"
./node_modules/.bin/conformance server --url "$URL" --expected-failures "$BASELINE"

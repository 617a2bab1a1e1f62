#!/usr/bin/env bash
# `make run`: a short tour on the embedded default. Starts `brood dev` (embedded
# NATS + JetStream, coordinator, spawn worker, scripted model) on a free
# loopback port with a temporary data directory, then uses the CLI against it.
set -euo pipefail
BIN=${1:-./bin/brood}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
DATA=$(mktemp -d)
LOG="$DATA/dev.log"
"$BIN" dev --data "$DATA" --listen 127.0.0.1:0 >"$LOG" 2>&1 &
DEV=$!
cleanup() {
  if kill -0 "$DEV" 2>/dev/null; then kill -INT "$DEV" 2>/dev/null || true; wait "$DEV" || true; fi
  rm -rf "$DATA"
}
trap cleanup EXIT

URL=""
for _ in $(seq 1 200); do
  URL=$(grep -o 'nats://[0-9.]*:[0-9]*' "$LOG" | head -1 || true)
  [ -n "$URL" ] && break
  kill -0 "$DEV" 2>/dev/null || { cat "$LOG"; echo "brood dev exited"; exit 1; }
  sleep 0.05
done
[ -n "$URL" ] || { cat "$LOG"; echo "brood dev printed no URL"; exit 1; }
export BROOD_NATS_URL="$URL"
for _ in $(seq 1 100); do
  "$BIN" providers 2>/dev/null | grep -q '^spawn ' && break
  sleep 0.1
done

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "brood dev is running at $URL"
sed -n '1,3p' "$LOG"

step "brood providers"
"$BIN" providers

step "brood run --provider spawn --json 'call list_dir {}' + 'say ...'  (a one-shot child lists this directory, then answers)"
OUT=$("$BIN" run --provider spawn --json $'call list_dir {}\nsay I listed the workspace; see the tool result in my log.')
echo "$OUT"
CHILD=$(printf '%s' "$OUT" | grep -o '"childId": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')

step "brood run --provider spawn \"say hello\""
"$BIN" run --provider spawn "say hello"

step "a refused request: brood run --provider nope x"
if "$BIN" run --provider nope x 2>"$DATA/err"; then echo "expected a refusal"; exit 1; fi
cat "$DATA/err"

step "brood log $CHILD  (the child's header, then every event of its log)"
"$BIN" log "$CHILD"

step "Ctrl-C drains brood dev"
kill -INT "$DEV"
if wait "$DEV"; then echo "brood dev exited 0"; else echo "brood dev exited $?"; exit 1; fi

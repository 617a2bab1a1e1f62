#!/usr/bin/env bash
# `make run`: a short tour on the embedded default. Starts `brood dev` (embedded
# NATS + JetStream, a coordinator, the spawn, fork and acp providers, the
# scripted model) on a free loopback port with a temporary data directory,
# then uses the CLI against it; restarts it once to show that a continuable
# child survives.
set -euo pipefail
BIN=${1:-./bin/brood}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
DATA=$(mktemp -d)
DEV=""
cleanup() {
  if [ -n "$DEV" ] && kill -0 "$DEV" 2>/dev/null; then kill -INT "$DEV" 2>/dev/null || true; wait "$DEV" || true; fi
  rm -rf "$DATA"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# start_dev starts brood dev on DATA and waits until every provider is listed.
start_dev() {
  local log="$DATA/dev-$1.log"
  "$BIN" dev --data "$DATA" --listen 127.0.0.1:0 >"$log" 2>&1 &
  DEV=$!
  URL=""
  for _ in $(seq 1 200); do
    URL=$(grep -o 'nats://[0-9.]*:[0-9]*' "$log" | head -1 || true)
    [ -n "$URL" ] && break
    kill -0 "$DEV" 2>/dev/null || { cat "$log"; echo "brood dev exited"; exit 1; }
    sleep 0.05
  done
  [ -n "$URL" ] || { cat "$log"; echo "brood dev printed no URL"; exit 1; }
  export BROOD_NATS_URL="$URL"
  for _ in $(seq 1 100); do
    [ "$("$BIN" providers 2>/dev/null | grep -cE '^(spawn|fork|acp) ')" = 3 ] && break
    sleep 0.1
  done
  sed -n '1,3p' "$log"
}

stop_dev() {
  kill -INT "$DEV"
  if wait "$DEV"; then echo "brood dev drained and exited 0"; else echo "brood dev exited $?"; exit 1; fi
  DEV=""
}

step "brood dev (embedded NATS with JetStream, all services, the scripted model)"
start_dev 1

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

step "brood run --provider acp \"say hi\"  (through the ACP bridge to Brood's own ACP agent)"
"$BIN" run --provider acp "say hi"

step "brood start --provider spawn \"say one\"  (a continuable child)"
OUT=$("$BIN" start --provider spawn "say one")
echo "$OUT"
CONT=$(printf '%s' "$OUT" | awk '/^childId/{print $2}')

step "Ctrl-C drains brood dev; it starts again on the same data"
stop_dev
start_dev 2

step "brood followup $CONT \"say two\"  (as the user; the child resumes on the new process)"
"$BIN" followup "$CONT" "say two"
for _ in $(seq 1 100); do
  [ "$("$BIN" state "$CONT")" = none ] && "$BIN" log "$CONT" | grep -q 'turn 2 completed' && break
  sleep 0.1
done

step "brood log $CONT  (both turns, one before and one after the restart)"
"$BIN" log "$CONT"

step "brood result $CONT  (what it answered last: the answer on stdout, the turn on stderr)"
"$BIN" result "$CONT"

step "three background children: brood start ... (two slow, one quick)"
A=$("$BIN" start --provider spawn --label slow-a $'sleep 60s\nsay a' | awk '/^childId/{print $2}')
B=$("$BIN" start --provider spawn --label quick-b "say b" | awk '/^childId/{print $2}')
C=$("$BIN" start --provider spawn --label slow-c $'sleep 60s\nsay c' | awk '/^childId/{print $2}')
for _ in $(seq 1 100); do
  [ "$("$BIN" state "$A")" = running ] && [ "$("$BIN" state "$C")" = running ] && [ "$("$BIN" state "$B")" = none ] && break
  sleep 0.1
done
echo "a: $("$BIN" state "$A")  b: $("$BIN" state "$B")  c: $("$BIN" state "$C")"
"$BIN" result "$B"
"$BIN" children

step "brood interrupt $A; brood dispose $C"
"$BIN" interrupt "$A"
"$BIN" dispose "$C"

step "brood drain; a followup meanwhile is held; brood drain --list; brood drain --lift"
"$BIN" drain
"$BIN" followup "$B" "say held until the lift"
"$BIN" drain --list
"$BIN" drain --lift
"$BIN" result --wait "$B"

step "Ctrl-C drains brood dev"
stop_dev

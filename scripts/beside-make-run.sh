#!/usr/bin/env bash
# Runs a command (make test, in .ci/run) beside the broker `make run`
# serves, and fails unless the command passed AND left that broker's data
# as it was: a test suite that writes into the data of the broker it sits
# beside is the one loss we could cause ourselves. The broker is started on
# the shipped configuration, given one record, and its database dumped with
# sqlite3 before and after; the dumps must be equal and the broker must
# still answer /health.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: beside-make-run.sh COMMAND..." >&2; exit 2; }

db=/var/tmp/saguin/saguin.db
health=http://127.0.0.1:9883/health
log=$(mktemp -t saguin-make-run-XXXXXX.log)
make --no-print-directory build >/dev/null
./bin/saguin --config examples/saguin.yaml >"$log" 2>&1 &
pid=$!
stop() { kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 1 100); do
  curl -fsS "$health" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { echo "make run's broker did not start:"; cat "$log"; exit 1; }
  sleep 0.1
done
curl -fsS "$health" >/dev/null || { echo "make run's broker does not answer $health:"; cat "$log"; exit 1; }
marker="beside-make-run $(date +%s%N)"
mosquitto_pub -h 127.0.0.1 -p 1883 -V mqttv5 -q 1 -t events/beside -m "$marker"
before=$(mktemp) after=$(mktemp)
sqlite3 "file:$db?mode=ro" .dump >"$before"
echo "== beside make run (pid $pid, $db: $(wc -l <"$before") dump lines): $*"

"$@"

sqlite3 "file:$db?mode=ro" .dump >"$after"
if ! diff -q "$before" "$after" >/dev/null; then
  echo "FAIL: '$*' changed the data of the broker make run serves ($db):"
  diff "$before" "$after" | head -40
  exit 1
fi
curl -fsS "$health" >/dev/null || { echo "FAIL: make run's broker stopped answering during '$*':"; tail -20 "$log"; exit 1; }
echo "== beside make run: its data unchanged ($(wc -l <"$after") dump lines), /health answers"

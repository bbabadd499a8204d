#!/usr/bin/env bash
# Runs every invariant guard (tests named TestInvariantNN_*) in every module
# and prints the table of the eighteen invariants: the guards covering each
# — those tests and the chaos harness's checks, with the verdicts of the last
# chaos campaigns (make chaos-short writes them under bin/chaos-short) —
# pass/fail, and the invariants with no guard yet.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=$(mktemp)
catalog=$(mktemp)
trap 'rm -f "$out" "$catalog"' EXIT
for m in storage broker examples linearizability chaos; do
  (cd "$m" && go test -count=1 -short -json -run 'TestInvariant' ./... 2>/dev/null) >>"$out"
done
(cd chaos && go run ./cmd/chaos -catalog) >"$catalog"
cd broker && go run ./internal/tools/invariants -catalog "$catalog" -reports "$root/bin/chaos-short/*/report.json" <"$out"

#!/usr/bin/env bash
# Runs every invariant guard (tests named TestInvariantNN_*) in every module
# and prints the table of the eighteen invariants: the guards covering each,
# pass/fail, and the invariants with no guard yet.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for m in storage broker; do
  (cd "$m" && go test -count=1 -json -run 'TestInvariant' ./... 2>/dev/null) >>"$out"
done
cd broker && go run ./internal/tools/invariants <"$out"

#!/usr/bin/env bash
# The table of the eighteen invariants: for each, its guards — the tests
# named TestInvariantNN_* in every module with each of their subtests, the
# subtests named InvariantNN_* under any test (storagetest's conformance
# cases, which each provider's TestInvariantConformance runs), and the chaos
# harness's checks,
# with the verdicts of the last chaos campaigns (make chaos-short writes them
# under bin/chaos-short) — and the code that keeps it: every comment line
# "// invariant N: ..." in non-test Go source, with file:line and the
# function it sits in. Exits non-zero, naming the invariant, when one has no
# guard, no marked code, or a guard that failed.
#
#   scripts/invariants.sh          runs every guard and gives pass/fail (make invariants)
#   scripts/invariants.sh -check   runs no test: the guards the source declares
#                                  and the marked code (make invariants-check,
#                                  part of make test)
# Any further arguments go to the tool (-v prints each marker's comment).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
check=
if [ "${1:-}" = "-check" ]; then
  check=1
  shift
fi
catalog=$(mktemp)
out=$(mktemp)
trap 'rm -f "$out" "$catalog"' EXIT
(cd chaos && go run ./cmd/chaos -catalog) >"$catalog" || exit 2
# chaos and linearizability check the broker rather than are it: their own
# markers (the harness's bounds) are listed but keep no invariant.
tool=(go run ./internal/tools/invariants -root "$root" -harness chaos,linearizability
  -catalog "$catalog" -reports "$root/bin/chaos-short/*/report.json")
if [ -n "$check" ]; then
  cd broker && "${tool[@]}" -check "$@" </dev/null
  exit
fi
# -run TestInvariant takes TestInvariantNN_* and TestInvariantConformance;
# the tool counts each guard's subtests from the -json events.
for m in storage broker examples linearizability chaos; do
  (cd "$m" && go test -count=1 -short -json -run 'TestInvariant' ./... 2>/dev/null) >>"$out"
done
cd broker && "${tool[@]}" "$@" <"$out"

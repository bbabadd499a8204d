#!/usr/bin/env bash
# Runs every go test -fuzz target of the repository briefly, FUZZTIME inputs
# each (default 20000x: a count, not a duration — a duration ends in a
# deadline that a loaded 2-core machine turns into a "context deadline
# exceeded" failure of the fuzzer itself, seen in CI): every parser of client-
# or file-controlled input that is ours (seek payloads, point-read keys, $saguin/ routes and queue verdicts,
# saguin-filter, configuration values, the ACL file, password files, snapshot files, stored JSON). The
# seed corpora also run as plain tests in make test; this adds mutation.
# A crasher is written under the package's testdata/fuzz and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-20000x}
n=0
while IFS= read -r line; do
  file=${line%%:*}
  name=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]+).*/\1/' <<<"$line")
  dir=$(dirname "$file")
  mod=$(cut -d/ -f1 <<<"$dir")
  pkg=./$(cut -d/ -f2- -s <<<"$dir")
  [ "$pkg" = "./" ] && pkg=.
  echo "fuzz $mod $pkg $name ($FUZZTIME)"
  (cd "$mod" && go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" >/tmp/fuzz-$$.log 2>&1) || {
    cat /tmp/fuzz-$$.log; rm -f /tmp/fuzz-$$.log; exit 1; }
  n=$((n+1))
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(' storage bridge broker chaos linearizability 2>/dev/null | sort)
rm -f /tmp/fuzz-$$.log
echo "fuzz: $n targets, $FUZZTIME each, no failure"

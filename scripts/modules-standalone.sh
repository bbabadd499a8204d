#!/usr/bin/env bash
# Each module of the go.work builds, vets and is tidy on its own, with the
# workspace off: its go.mod requires what it imports (siblings through a
# `replace` to ../<module>), a direct dependency is not marked indirect,
# and its go.sum is complete. Someone who copies one module out of the
# clone, or builds it with GOWORK=off as a packager does, must not find a
# missing requirement the workspace was hiding. One line per module; every
# module is checked before the script fails, so one run names them all.
set -uo pipefail
cd "$(dirname "$0")/.."
# The modules the go.work uses, so a module added there is checked here
# without editing this list.
mapfile -t modules < <(go list -m -f '{{.Dir}}' | sed "s|^$PWD/||")
failed=()
for m in "${modules[@]}"; do
  start=$SECONDS
  # tidy -diff changes nothing: it prints what tidy would change and fails.
  if out=$(cd "$m" && export GOWORK=off &&
    go build ./... 2>&1 && go vet ./... 2>&1 && go mod tidy -diff 2>&1); then
    echo "module $m: builds, vets and is tidy with GOWORK=off ($((SECONDS - start))s)"
  else
    echo "module $m: FAILS with GOWORK=off ($((SECONDS - start))s):"
    sed 's/^/    /' <<<"$out"
    failed+=("$m")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "not standalone: ${failed[*]} (fix its go.mod: GOWORK=off go mod tidy in that module)" >&2
  exit 1
fi

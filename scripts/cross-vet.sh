#!/usr/bin/env bash
# Every module builds for 32-bit and 64-bit alike (docs/operations.md "32-bit devices"). Vets (test files
# included) and builds every module of the go.work for each 32-bit target a
# gateway runs: 386 and arm (GOARM=7). Compile-only: 386 test binaries run
# natively on an amd64 kernel and make test-386 runs them; arm is checked
# for what the compiler catches (an untyped constant overflowing int, a
# syscall field 32 bits wide there). A mistake only the running code shows
# (a 64-bit atomic on a field not 8-aligned, an int overflowing 2^31) is
# what test-386 is for.
set -euo pipefail
cd "$(dirname "$0")/.."
MODULES=${MODULES:-"storage bridge broker chaos linearizability examples"}
TARGETS=${TARGETS:-"386 arm/7"}
for target in $TARGETS; do
  arch=${target%%/*}
  env=(GOARCH="$arch")
  [ "$arch" = arm ] && env+=(GOARM="${target#*/}")
  for m in $MODULES; do
    echo "vet+build $m ${env[*]}"
    (cd "$m" && env "${env[@]}" go vet ./... && env "${env[@]}" go build ./...)
  done
done

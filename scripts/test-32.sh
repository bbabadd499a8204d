#!/usr/bin/env bash
# make test-32: the 32-bit sets — the storage suite, the broker's invariant
# guards, and whole the packages whose answers every build must agree on
# (config sizes, partition bounds, topics) — run as 32-bit binaries, for
# 386 and for arm (GOARM=7, the Raspberry Pi class of device the broker is
# deployed on). Each runs natively where this kernel runs it, else under
# qemu-user through `go test -exec`; the tests that start a broker or
# re-execute themselves go through the same way (storagetest/emulate).
# The way is decided once here (archway) and exported as SAGUIN_RUN_<ARCH>
# so every process of the run agrees; each set says which way it ran and
# how long it took. Where nothing runs an arch the run fails naming the
# package to install: never a silent skip.
#
# SAGUIN_FORCE_EMULATED=1 ignores native support, so a machine whose kernel
# runs 386 proves the path of one that does not.
# TARGETS (default "386 arm/7") selects the archs.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=${TARGETS:-"386 arm/7"}

archs=()
for t in $TARGETS; do archs+=("${t%%/*}"); done
ways=$(cd storage && go run ./storagetest/emulate/cmd/archway "${archs[@]}")

run_set() { # name dir args...
  local name=$1 dir=$2; shift 2
  local start=$SECONDS
  echo "== $name ($way_text)"
  (cd "$dir" && "${goenv[@]}" go test "${exec_flag[@]}" -count=1 "$@")
  echo "== $name: ${way_text}, $((SECONDS - start)) s"
}

total=$SECONDS
for t in $TARGETS; do
  arch=${t%%/*}
  line=$(grep "^$arch " <<<"$ways")
  runner=$(cut -d' ' -f2 <<<"$line")
  goenv=(env GOARCH="$arch")
  [ "$arch" = arm ] && goenv+=(GOARM="${t#*/}")
  exec_flag=()
  if [ "$runner" = native ]; then
    way_text="$arch native"
    export "SAGUIN_RUN_${arch^^}=native"
  else
    way_text="$arch under $(basename "$runner") $(cut -d' ' -f3 <<<"$line")"
    export "SAGUIN_RUN_${arch^^}=$runner"
    exec_flag=(-exec "$runner")
  fi
  run_set "storage (GOARCH=$arch)" storage -timeout 30m ./...
  run_set "broker invariant guards (GOARCH=$arch)" broker -timeout 30m -run 'TestInvariant' ./...
  run_set "broker config, partition, topic (GOARCH=$arch)" broker -timeout 15m ./config ./partition ./topic
done
echo "== 32-bit sets: $((SECONDS - total)) s in all"

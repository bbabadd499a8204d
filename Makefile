# Sagüin — make targets. `make run` starts the broker on examples/saguin.yaml
# with data under /var/tmp/saguin; `make test` runs every test CI runs.
SHELL := /bin/bash
GO ?= go
REVISION := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo devel)
BIN := bin/saguin
MODULES := storage bridge broker examples
ALL_MODULES := storage bridge broker chaos linearizability examples

.PHONY: build run test vet vet-32 test-32 fuzz-short bench invariants invariants-check chaos-bin chaos-short chaos clean

build:
	@mkdir -p bin
	cd broker && $(GO) build -ldflags "-X main.revision=$(REVISION)" -o ../$(BIN) ./cmd/saguin

# The example as shipped: MQTT on :1883, data in /var/tmp/saguin (the
# broker creates it).
run: build
	./$(BIN) --config examples/saguin.yaml

vet:
	@for m in $(ALL_MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

# 32-bit: every module builds for 32-bit and 64-bit targets alike
# (docs/operations.md "32-bit devices").
# vet-32: every module vetted (test files too) and built for 386 and for
# arm with GOARM=7 (compile-only). test-32: the storage suite, the broker's
# invariant guards and, whole, the packages whose answers every build must
# agree on (config sizes, partition bounds, topics) run as 386 and as arm
# (GOARM=7) binaries — natively where the kernel runs them, else under
# qemu-user (scripts/test-32.sh says which way each set ran and its time;
# SAGUIN_FORCE_EMULATED=1 forces the emulator). The brokers those tests
# start are built for the same GOARCH and run the same way. Both are part
# of make test.
vet-32:
	@bash scripts/cross-vet.sh

# Each module builds, vets and is tidy with GOWORK=off, as a lone checkout does.
.PHONY: modules-standalone
modules-standalone:
	@bash scripts/modules-standalone.sh

test-32:
	@bash scripts/test-32.sh

# Every module's tests. -count=1: never report a cached pass for a broker
# that talks to real sockets.
# After the 64-bit module tests, test-32 runs the storage suite and the
# invariant guards again as 386 and arm binaries (and broker's own tests
# include a data directory moved between the amd64 build and each 32-bit
# one, both ways).
# linearizability runs its -short set here (its long property runs are for
# make chaos); chaos runs the power-cut filesystem's tests (FUSE, as root),
# the harness's short campaigns with every negative control, and then
# chaos-short: seeded campaigns against the real binary. First of all,
# invariants-check: an invariant with no guard or no marked code fails CI.
test: invariants-check vet vet-32 modules-standalone
	@set -o pipefail; for m in $(MODULES); do \
	  echo "== $$m"; (cd $$m && $(GO) test -count=1 -timeout 20m ./...) || exit 1; \
	done
	@echo "== broker, fault-injection build (a panic ends one connection)"; cd broker && $(GO) test -count=1 -tags saguinfaults -run '^TestFaultBuild' . ./internal/faults/
	@$(MAKE) --no-print-directory test-32
	@echo "== linearizability"; cd linearizability && $(GO) test -count=1 -short -timeout 10m ./...
	@echo "== chaos (faultfs, harness, negative controls)"; cd chaos && $(GO) test -count=1 -short -timeout 20m ./...
	@$(MAKE) --no-print-directory fuzz-short
	@$(MAKE) --no-print-directory chaos-short

# Every fuzz target, mutating for FUZZTIME each (their seed corpora already
# ran as tests above).
FUZZTIME ?= 20000x
fuzz-short:
	@echo "== fuzz"; FUZZTIME=$(FUZZTIME) bash scripts/fuzz-short.sh

# NATS server's MQTT listener is the bench's durable 3.1.1 peer: a pinned
# release installed into bin/, never a dependency of our modules.
NATS_SERVER := bin/nats-server
$(NATS_SERVER):
	@mkdir -p bin
	cd /tmp && GOWORK=off GOBIN=$(CURDIR)/bin $(GO) install github.com/nats-io/nats-server/v2@v2.15.2

bench: build $(NATS_SERVER)
	cd broker && $(GO) run ./cmd/saguin-bench -nats-server $(CURDIR)/$(NATS_SERVER) $(BENCH_FLAGS)

# Chaos campaigns (rfcs/chaos-harness.md). Needs root, /dev/fuse and fuse3
# for power cuts. chaos-short is part of make test: 35 cycles on sqlite
# (nemeses dealt in rounds of kill x2, powercut x2, term, stop, cut: exactly
# 10 kills and 10 power cuts) and 12 on memory. CHAOS_WAIVE names checks
# whose findings are a documented broker gap (printed as waived, never
# hidden); none is waived today.
CHAOS_WAIVE ?=
CHAOS_SEED ?= 1
DURATION ?= 1h
CHAOS_BIN := bin/chaos
chaos-bin: build
	cd chaos && $(GO) build -o ../$(CHAOS_BIN) ./cmd/chaos

chaos-short: chaos-bin
	./$(CHAOS_BIN) -q -binary $(BIN) -seed $(CHAOS_SEED) -cycles 35 -provider sqlite \
	  -nemeses kill=2,powercut=2,term,stop,cut -waive "$(CHAOS_WAIVE)" -out $(CURDIR)/bin/chaos-short
	./$(CHAOS_BIN) -q -binary $(BIN) -seed $(CHAOS_SEED) -cycles 12 -provider memory \
	  -nemeses kill,powercut,term,stop,cut -waive "$(CHAOS_WAIVE)" -out $(CURDIR)/bin/chaos-short

chaos: chaos-bin
	./$(CHAOS_BIN) -binary $(BIN) -seed $(CHAOS_SEED) -duration $(DURATION) -provider sqlite,memory \
	  -nemeses kill=2,powercut=2,term,stop,cut -waive "$(CHAOS_WAIVE)" -out $(CURDIR)/bin/chaos-runs

# The eighteen invariants, each with its guards (TestInvariantNN_* tests and
# chaos checks) and the code that keeps it ("// invariant N:" comments, with
# file:line and function). invariants runs every guard (pass/fail);
# invariants-check runs none — it reads the source and fails when an
# invariant has no guard or no marked code.
# INVARIANTS_FLAGS=-v prints each marker's comment.
invariants:
	@bash scripts/invariants.sh $(INVARIANTS_FLAGS)

invariants-check:
	@echo "== invariants (guards and marked code, no test run)"; bash scripts/invariants.sh -check $(INVARIANTS_FLAGS)

clean:
	rm -rf bin

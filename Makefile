# Sagüin — make targets. `make run` starts the broker on examples/saguin.yaml
# with data under ./data; `make test` runs every test CI runs.
SHELL := /bin/bash
GO ?= go
REVISION := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo devel)
BIN := bin/saguin
MODULES := storage broker examples

.PHONY: build run test test-go vet bench invariants chaos-short chaos conformance clean

build:
	@mkdir -p bin
	cd broker && $(GO) build -ldflags "-X main.revision=$(REVISION)" -o ../$(BIN) ./cmd/saguin

run: build
	@mkdir -p data
	sed "s|@DATA@|$(CURDIR)/data|" examples/saguin.yaml > bin/saguin-run.yaml
	./$(BIN) --config bin/saguin-run.yaml

vet:
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

# Every module's tests. -count=1: never report a cached pass for a broker
# that talks to real sockets.
# linearizability runs its -short set here (its long property runs are for
# make chaos); chaos runs the power-cut filesystem's tests (FUSE, as root).
test: vet
	@set -o pipefail; for m in $(MODULES); do \
	  echo "== $$m"; (cd $$m && $(GO) test -count=1 -timeout 20m ./...) || exit 1; \
	done
	@echo "== linearizability"; cd linearizability && $(GO) test -count=1 -short -timeout 10m ./...
	@echo "== chaos/faultfs"; cd chaos && $(GO) test -count=1 -timeout 10m ./faultfs/

bench: build
	cd broker && $(GO) run ./cmd/saguin-bench

invariants:
	@bash scripts/invariants.sh

clean:
	rm -rf bin

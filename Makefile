# holdfast — see README.md.
export PATH := $(PATH):/usr/sbin
GO ?= go
PKGS := ./...

.PHONY: all deps test bench lint demo demo-docs reliability chaos

all: lint test

deps:
	@bash scripts/deps.sh

# The whole suite, race detector on, against real redis-server processes the
# tests start on free loopback ports.
test: deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	cd grpclimit && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

# Every fuzz target for a longer budget (make test gives each 10s).
FUZZTIME ?= 10s
fuzz:
	FUZZTIME=2m bash scripts/fuzz.sh

# The benchmark harness (bench/, its own module so the peers it measures never
# become dependencies of the library): vet and smoke-test it, then run it and
# write BENCHMARKS.md, then Envoy's rate limit service against HTTP
# (scripts/bench-rls.sh). About 16 minutes; BENCHFLAGS=-quick for a 1-minute smoke
# run (see `cd bench && go run ./cmd/bench -h`).
BENCHFLAGS ?=
bench: deps
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd bench && $(GO) run ./cmd/bench $(BENCHFLAGS) -out ../BENCHMARKS.md
	bash scripts/bench-rls.sh >> BENCHMARKS.md

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# The demo: redis-server, 4 `holdfast-demo serve` instances and nginx on
# loopback ports; load, a Redis kill and restart; the table, the invariants
# and a report (its path is printed last). DEMO_ARGS passes cluster flags,
# e.g. make demo DEMO_ARGS='--outage 20s --backend rueidis --out /tmp/report'.
DEMO_BIN := $(CURDIR)/bin/holdfast-demo
DEMO_ARGS ?=

demo: deps
	$(GO) build -o $(DEMO_BIN) ./cmd/demo
	$(DEMO_BIN) cluster $(DEMO_ARGS)

# The README's chart and table, from a real run with the default flags.
demo-docs: deps
	$(GO) build -o $(DEMO_BIN) ./cmd/demo
	rm -rf $(CURDIR)/bin/demo-report
	$(DEMO_BIN) cluster --out $(CURDIR)/bin/demo-report $(DEMO_ARGS)
	cp $(CURDIR)/bin/demo-report/report.svg docs/demo-report.svg
	cp $(CURDIR)/bin/demo-report/table.md docs/demo-table.md
	@echo "updated docs/demo-report.svg and docs/demo-table.md (paste the table into README.md)"

# docs/RELIABILITY.md: the fault tests (Redis kill, SIGSTOP, flapping, Redis
# Cluster failover and shard loss, network faults through toxiproxy, error
# replies such as OOM and READONLY, an instance restarted or crashed
# mid-outage, a key flood, TLS), with their table and figures written to
# CHAOS_OUT. About 5 minutes; CI runs it too, writing to a temp file.
CHAOS_OUT ?= $(CURDIR)/docs/RELIABILITY.md
CHAOS_TESTS := TestOutage$$|TestOutageManyKeys|TestBlackHole|TestFrozenDefaultDeadline|TestFlapping|TestGentle|TestCluster|TestNet|TestReplyFault|TestRestartMidOutage|TestCrashLoses|TestKeyFlood|TestTLS
chaos: deps
	HOLDFAST_RELIABILITY_OUT=$(CHAOS_OUT) $(GO) test -count=1 -timeout 15m -run '$(CHAOS_TESTS)' ./fallback
	@echo "wrote $(CHAOS_OUT)"

reliability: chaos

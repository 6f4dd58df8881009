# holdfast — see README.md.
export PATH := $(PATH):/usr/sbin
GO ?= go
PKGS := ./...

.PHONY: all deps test bench lint demo reliability

all: lint test

deps:
	@bash scripts/deps.sh

# The whole suite, race detector on, against real redis-server processes the
# tests start on free loopback ports.
test: deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

bench: deps
	$(GO) test -run '^$$' -bench BenchmarkAllow -benchmem -cpu 1,2 -count 3 ./backend/...

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

demo: deps
	$(GO) run ./cmd/demo

# docs/RELIABILITY.md: the fault tests, with their table written out.
reliability: deps
	HOLDFAST_RELIABILITY_OUT=$(CURDIR)/docs/RELIABILITY.md $(GO) test -count=1 -run 'TestOutage$$|TestBlackHole|TestFlapping|TestGentle' ./fallback

# holdfast — see README.md.
export PATH := $(PATH):/usr/sbin
GO ?= go
PKGS := ./...

.PHONY: all deps test test-short bench lint demo fuzz

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

#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (default 20s).
# Whatever a fuzzer finds is written under testdata/fuzz and becomes a
# regression case that plain `go test` runs from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
t="${FUZZTIME:-20s}"
grep -rl --include='*_test.go' '^func Fuzz' --exclude-dir=bench . | while read -r f; do
	pkg="./$(dirname "${f#./}")"
	grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r target; do
		echo "fuzz $pkg $target ($t)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" "$pkg"
	done
done

#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (default 20s).
# Whatever a fuzzer finds is written under testdata/fuzz and becomes a
# regression case that plain `go test` runs from then on.
#
# Go 1.26's fuzz coordinator can end a run with a bare "context deadline
# exceeded" at the -fuzztime boundary when a worker is slow to stop on a
# loaded machine (golang/go#75804, fixed in Go 1.27): no input failed and
# none is written. Such a run counts as passed only if no new input appeared
# under testdata/fuzz and the target's corpus replays cleanly; any other
# failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
t="${FUZZTIME:-20s}"
count() { { find "$1" -type f 2>/dev/null || true; } | wc -l; }
grep -rl --include='*_test.go' '^func Fuzz' --exclude-dir=bench . | while read -r f; do
	dir="$(dirname "${f#./}")"
	pkg="./$dir"
	grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r target; do
		echo "fuzz $pkg $target ($t)"
		corpus="$dir/testdata/fuzz/$target"
		before=$(count "$corpus")
		out=$(mktemp)
		if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" "$pkg" 2>&1 | tee "$out"; then
			rm -f "$out"
			continue
		fi
		if [ "$(count "$corpus")" = "$before" ] && grep -q '^    context deadline exceeded$' "$out" && ! grep -q 'Failing input written' "$out"; then
			echo "fuzz $pkg $target: stopped by the fuzztime deadline race (golang/go#75804), no failing input; replaying the corpus"
			go test -count=1 -run "^${target}\$" "$pkg"
			rm -f "$out"
			continue
		fi
		rm -f "$out"
		echo "fuzz $pkg $target: FAILED"
		exit 1
	done
done

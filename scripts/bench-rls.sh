#!/usr/bin/env bash
# Prints the comparison of Envoy's rate limit service (RLS v3 over gRPC, 64
# concurrent streams on one connection) against the same decisions through
# HTTP (64 keep-alive connections), both on one holdfast-demo serve instance
# over Redis, as a BENCHMARKS.md section: BenchmarkDecisions in
# cmd/demo/serve, 3 runs of 20000 decisions each path. make bench appends it.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd="go test -run '^\$' -bench Decisions -benchtime 20000x -count 3 ./cmd/demo/serve"
out=$(eval "$cmd" 2>&1 | grep '^BenchmarkDecisions/')
echo
echo "## 8. Envoy's rate limit service against HTTP"
echo
echo "One \`holdfast-demo serve\` instance over redis-server, every decision through Redis and admitted (a token"
echo "bucket of a million a second per client), 64 calls in flight: ShouldRateLimit on one gRPC connection (64"
echo "concurrent streams) against GET of a limited route (64 keep-alive connections). Client, serve and Redis share"
echo "the machine's cores, so compare the rows of one run. \`$cmd\`:"
echo
echo "| path | run | decisions/s | p99 |"
echo "| --- | --: | --: | --: |"
echo "$out" | awk '{
	path = $1; sub(/^BenchmarkDecisions\//, "", path); sub(/-[0-9]+$/, "", path)
	n[path]++
	for (i = 1; i < NF; i++) { if ($(i+1) == "decisions/s") d = $i; if ($(i+1) == "p99-µs") p = $i }
	printf "| %s | %d | %.1fk | %.2f ms |\n", path, n[path], d / 1000, p / 1000
}'

package fallback_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
)

// The fault tests record one row each; with HOLDFAST_RELIABILITY_OUT set,
// TestMain writes them as the table of docs/RELIABILITY.md
// (`make reliability`).
var (
	rowsMu sync.Mutex
	rows   []string
)

func record(fault, backend string, p core.Policy, ld *load, bound float64) {
	ld.mu.Lock()
	lat := slices.Clone(ld.lat)
	ld.mu.Unlock()
	slices.Sort(lat)
	p99 := time.Duration(0)
	if len(lat) > 0 {
		p99 = lat[len(lat)*99/100]
	}
	ratio := "—"
	if bound > 0 {
		ratio = fmt.Sprintf("%.3f", float64(ld.admitted.Load())/bound)
	}
	row := fmt.Sprintf("| %s | %s | %s | %d | %d | %s | %d | %v | %v |", fault, backend, p.Algorithm().Name(),
		ld.admitted.Load(), ld.denied.Load(), ratio, ld.errors.Load(),
		p99.Round(10*time.Microsecond), time.Duration(ld.worst.Load()).Round(10*time.Microsecond))
	rowsMu.Lock()
	rows = append(rows, row)
	rowsMu.Unlock()
}

const reportHead = `# holdfast reliability

Produced by ` + "`make chaos`" + ` (the fault tests of ` + "`fallback`" + `
with HOLDFAST_RELIABILITY_OUT set), on the machine that ran it: real redis-server
processes, 4 instances (each a ` + "`fallback.Limiter`" + ` with its own client; in the network
fault rows each reaches Redis through its own in-process toxiproxy) behind a
round-robin "load balancer" of 4 goroutines sending a request every 2 ms — far above the
policy — for one key. The call deadline is 300 ms (generous, so a busy machine under
-race does not trip breakers while Redis is healthy); probes every 200 ms.

Policies: token bucket of capacity 10 refilled at 20/s; sliding window and sliding
window counter of 20 per 1 s. The bound is what one exact limiter would admit over the
run (token bucket: capacity + rate × duration; sliding window: limit × (whole
windows + 1); sliding window counter: limit × (windows the run overlaps + 1), a limit
in each fixed window, where one counter gives this client the limit and then one unit
less a window: 144 to 162 of the bound of 180 over 7.5 s, 0.80 to 0.90).
The "100 keys" rows (TestOutageManyKeys) cycle their requests, one every 1 ms per
goroutine, over 100 keys, with a token bucket of 5 refilled at 5/s and a sliding window
of 10 per 2 s; their bound is the sum of the keys' bounds.
admitted ÷ bound is what the instances admitted together, counted at the load balancer.
p99 and max are the decision latencies the callers saw, all decisions of the run.

| fault | backend | algorithm | admitted | denied | admitted ÷ bound | errors | p99 | max |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
`

func TestMain(m *testing.M) {
	code := m.Run()
	if out := os.Getenv("HOLDFAST_RELIABILITY_OUT"); out != "" && len(rows) > 0 {
		slices.Sort(rows)
		text := reportHead + strings.Join(rows, "\n") + "\n\n" + reportTail
		if n := notesText(); n != "" {
			text += "\n## Other measurements\n\n" + n
		}
		if err := os.WriteFile(out, []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "reliability report:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const reportTail = `Reading the table:

- Kill -9 rows land at 1.00 of the bound (token bucket within a few units): during the
  outage each instance enforces its share; at recovery each token bucket batch is
  charged its marginal cost in one global bucket fed every replayed grant, sliding
  window grants go back with their original times, and all instances return to Redis
  together at the recovery barrier (docs/DESIGN.md).
- The 100-key kill -9 rows replay a batch per key from each instance into a Redis that
  restarted empty. Token bucket: the first instance's replay writes the keys Redis lost
  in fresh calls (the client computes each key's value, under the replay's markers),
  and the batches of the instances after it merge into those through the replay
  scripts (docs/DESIGN.md, "Fresh calls"). Sliding window: a batch with seed units goes
  in a fresh call, one without as plain writes, no script and no marker ("Plain writes").
  The test also holds each key within 1.05 of its own bound.
- SIGSTOP rows land at 1.00: a call that timed out after it was sent is decided
  locally and logged, and when the frozen Redis resumes it refuses the buffered calls,
  whose deadline (sent in Redis time) has passed, without writing (the deadline guard,
  docs/errors.md). Before the guard these rows landed at 0.79–0.90: Redis applied the
  buffered calls and those requests counted twice. No decision waits past the call
  deadline (max ≈ 300 ms = the deadline used here).
- Error-reply rows (OOM, READONLY, NOPERM, WRONGPASS, BUSY, MISCONF, LOADING) land at
  1.00, as a kill does: Redis answers at once but refuses every write, the first refusal
  opens a breaker, decisions go to leases, and the probe (the membership heartbeat, a
  scripted write) keeps failing until the fault is lifted, so no breaker closes before.
- The SIGSTOP row at the default 50 ms deadline (every other row uses 300 ms) checks the
  deadline guard: the calls the frozen Redis runs when it resumes are past their
  deadline in Redis time and are refused without writing, so they spend no quota.
  The CLIENT PAUSE WRITE rows are the same freeze that a PING does not see: Redis
  answers PING and new connections but holds every script (EVALSHA may write), the
  probe's too, so the breakers stay open until the pause is lifted, and the guard
  refuses the held calls when they run.
- Flapping pays a little at every switch; its assertion is 1.10.
- Network faults on some links only (a partial partition; latency past the deadline
  on 2 of 4 links) land above 1.0: the instances still on Redis get its whole refill
  while the others grant their 1/N shares, and the replay charges those grants back
  only down to one bucket of debt. Their slack is k/N × (capacity + rate × fault) −
  capacity for k instances cut off (docs/DESIGN.md, "Partial partitions").
- The client at half its rate must see zero denials; its bound column is not a limit
  test.

Reconciliation speed: ` + "`go test -run '^$' -bench BenchmarkReconcile -benchtime 3x -count 3 ./reconcile`" + `
(100k token bucket keys, three grants each, through one client's pipelines).
`

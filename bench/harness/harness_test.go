package harness

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
)

// TestSmoke runs every section at a tiny size and checks that the report
// has each part and that no limiter failed. It asserts behaviour, not
// speed: the figures of a run this short mean nothing.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and runs every section")
	}
	cfg := Default()
	cfg.Reps, cfg.HeadlineReps = 1, 2
	cfg.Duration, cfg.Warmup = 30*time.Millisecond, 5*time.Millisecond
	cfg.HeadlineDuration = 40 * time.Millisecond
	cfg.Gs, cfg.Keys, cfg.DenialGs = []int{1, 64}, 1000, []int{4}
	cfg.LocalDuration = 20 * time.Millisecond
	cfg.OutageWindow, cfg.OutageBackends = 300*time.Millisecond, []string{"rueidis"}
	cfg.ReconcileSizes = []int{200}
	cfg.MemoryKeys = 1000
	cfg.CeilingRequests = 2000
	cfg.RecoveryKeys, cfg.RecoveryReps = 200, 1
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	md := rep.Markdown()
	for _, want := range []string{
		"## Targets", "## 1. Decisions per second", "## 1b.", "## 2. The local path", "## 3. Decision latency",
		"## 4. Reconciliation", "## 5. Redis memory", "## 6. The Redis ceiling", "## 7. Recovery end to end", "### The script floor", "the best peer", implHFRueidisTB, implRedisRate, implUlule,
		implHFRueidisSC, implHFGoredisSC, memSC, "| " + slidingcounter.Name + " |",
		implLocalXRate, implLocalGoLim, memTB, "EVALSHA",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Sections 1 and 2 measure the full write path: every decision admits.
	for c, runs := range rep.Throughput.Runs {
		for _, s := range runs {
			if s.Errs > 0 || s.Ops == 0 || s.Denied != 0 {
				t.Errorf("%s G=%d: %d decisions, %d denied, %d errors (first: %v)", c.Impl, c.G, s.Ops, s.Denied, s.Errs, s.FirstErr)
			}
		}
	}
	for c, runs := range rep.Local.Runs {
		for _, s := range runs {
			if s.Errs > 0 || s.Ops == 0 || s.Allowed != s.Ops {
				t.Errorf("local %s P=%d hot=%v: %d decisions, %d admitted, %d errors", c.Impl, c.Procs, c.Hot, s.Ops, s.Allowed, s.Errs)
			}
		}
	}
	for c, runs := range rep.Throughput.Denial.Runs {
		for _, s := range runs {
			if s.Errs > 0 || s.Ops == 0 || s.Denied == 0 {
				t.Errorf("denied key %s G=%d: %d decisions, %d denied, %d errors", c.Impl, c.G, s.Ops, s.Denied, s.Errs)
			}
		}
	}
	for c, runs := range rep.Outage.Runs {
		for _, s := range runs {
			if s.Errs > 0 || s.Degraded == 0 {
				t.Errorf("outage %v: %d errors, %d of %d degraded", c, s.Errs, s.Degraded, s.Ops)
			}
		}
	}
	for _, row := range rep.Memory.Rows {
		if len(row.DeltaPerKey) == 0 || len(row.UsagePerKey) == 0 {
			t.Errorf("memory %s: no figures", row.Name)
		}
	}
	for c, runs := range rep.Ceiling.Runs {
		if len(runs) == 0 || runs[0] <= 0 {
			t.Errorf("ceiling %v: %v", c, runs)
		}
	}
	for _, sc := range rep.Ceiling.Floor.Scripts {
		for _, hot := range cfg.keysets() {
			c := floorCell{sc.Name, hot}
			if us, ps := rep.Ceiling.Floor.Us[c], rep.Ceiling.Floor.PerSec[c]; len(us) != cfg.HeadlineReps || us[0] <= 0 || len(ps) != cfg.HeadlineReps || ps[0] <= 0 {
				t.Errorf("floor %v: µs %v, calls/s %v", c, us, ps)
			}
		}
	}
	for b, runs := range rep.Recovery.Runs {
		for _, s := range runs {
			if s.Back <= 0 || s.Grants == 0 || s.Decisions == 0 {
				t.Errorf("recovery %s: %+v", b, s)
			}
		}
	}
	for c, runs := range rep.Throughput.Runs {
		if want := map[bool]int{true: 2, false: 1}[headline(c.Impl)]; len(runs) != want {
			t.Errorf("%s G=%d: %d runs, want %d", c.Impl, c.G, len(runs), want)
		}
	}
	if len(rep.Verdicts()) == 0 {
		t.Error("no target verdicts")
	}
}

func TestParseBenchmarkCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"EVALSHA 3402 1 hf:{cb:hot} 1000000 1 1","136054.42","7.084","0.792","7.039","11.727","12.999","13.367"
`
	v, err := parseBenchmarkCSV(out)
	if err != nil || v != 136054.42 {
		t.Fatalf("got %v, %v", v, err)
	}
	if _, err := parseBenchmarkCSV("ERROR: NOSCRIPT\n"); err == nil {
		t.Fatal("no error for output without a result")
	}
}

func TestPairedRatio(t *testing.T) {
	s := pairedRatio([]float64{2, 6, 3}, []float64{1, 2, 0})
	if s.N != 2 || s.Min != 2 || s.Max != 3 {
		t.Fatalf("%+v", s)
	}
}

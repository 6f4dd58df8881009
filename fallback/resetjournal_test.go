package fallback

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
)

// TestResetSurvivesRestart: a Reset during an outage is in the state dir.
// An instance restarted before Redis returns, cleanly or killed after the
// next flush, still holds the reset to apply, the grants logged before it
// stay dropped (only the 2 after it are in the log), and the key's lease
// continues from the reset: 2 of a full share spent, so 3 more admitted.
func TestResetSurvivesRestart(t *testing.T) {
	for _, crash := range []bool{false, true} {
		clk := &jclock{}
		clk.us.Store(1_700_000_000_000_000)
		dir := t.TempDir()
		ctx := context.Background()
		tb := must(tokenbucket.Policy("tb", 5, 5.0/3600))
		sw := must(slidingwindow.Policy("sw", 5, time.Hour))
		l := degraded(t, dir, Options{Clock: clk.now})
		for _, p := range []core.Policy{tb, sw} {
			for range 6 {
				clk.advance(time.Millisecond)
				if _, err := l.Allow(ctx, p, "cust"); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Reset(ctx, p, "cust"); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				clk.advance(time.Millisecond)
				if r, err := l.Allow(ctx, p, "cust"); err != nil || !r.Allowed {
					t.Fatalf("%s after Reset: %+v %v", p.Name(), r, err)
				}
			}
		}
		if crash {
			if err := l.jnl.flush(false); err != nil {
				t.Fatal(err)
			}
			l.Crash()
		} else if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2 := degraded(t, dir, Options{Clock: clk.now})
		if n := l2.resets.len(); n != 2 {
			t.Fatalf("crash=%v: %d resets pending after the restart, want 2", crash, n)
		}
		if got := units(l2.jnl.st); got != 4 {
			t.Fatalf("crash=%v: %d units in the restored log, want the 4 granted after the resets", crash, got)
		}
		for _, p := range []core.Policy{tb, sw} {
			for i := range 4 {
				clk.advance(time.Millisecond)
				r, err := l2.Allow(ctx, p, "cust")
				if err != nil || r.Allowed != (i < 3) {
					t.Fatalf("crash=%v: %s request %d after the restart: %+v %v, want %v", crash, p.Name(), i, r, err, i < 3)
				}
			}
		}
	}
}

func must(p core.Policy, err error) core.Policy {
	if err != nil {
		panic(err)
	}
	return p
}

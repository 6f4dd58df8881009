package fallback_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

// downStore is a Redis that is down.
type downStore struct{}

func (downStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return nil, core.ErrStoreUnavailable
}

// BenchmarkLocalDecision measures a decision while the breaker is open: the
// lease, the outage log and the bookkeeping around them, one hot key and
// 100k keys.
func BenchmarkLocalDecision(b *testing.B) {
	p, _ := tokenbucket.Policy("bench", 1_000_000_000, 1_000_000) // every decision admits
	benchLocal(b, p, "")
}

// benchLocal measures local decisions of policy p, which admits them all,
// on one hot key and on 100k keys; with a state dir, the limiter journals
// (and is started, for its flusher).
func benchLocal(b *testing.B, p core.Policy, stateDir string) {
	l, err := fallback.New(downStore{}, fallback.Options{
		ID: "bench", ExpectedInstances: 4, StateDir: stateDir,
		Breaker: fallback.BreakerOptions{Start: fallback.Open},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if stateDir != "" {
		if err := l.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
	} else {
		l.MarkStarted()
	}
	defer l.Close()
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	for _, bc := range []struct {
		name string
		keys []string
	}{{"hot_key", keys[:1]}, {"100k_keys", keys}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			i := 0
			for b.Loop() {
				r, err := l.Allow(ctx, p, bc.keys[i%len(bc.keys)])
				if err != nil || !r.Degraded {
					b.Fatalf("%+v %v", r, err)
				}
				i++
			}
		})
	}
}

// TestLocalDenialAllocatesNothing: while the breaker is open, a decision
// from the leases that denies a known key builds no storage key and
// allocates nothing (an admission allocates its log entry).
func TestLocalDenialAllocatesNothing(t *testing.T) {
	l, err := fallback.New(downStore{}, fallback.Options{
		ID: "allocs", ExpectedInstances: 4,
		Breaker: fallback.BreakerOptions{Start: fallback.Open},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	l.MarkStarted()
	defer l.Close()
	p, _ := tokenbucket.Policy("allocs", 4, 0.001) // a share of 1, refilled every ~70 min
	ctx := context.Background()
	admitted := 0
	for range 10 {
		r, err := l.Allow(ctx, p, "hot")
		if err != nil || !r.Degraded {
			t.Fatalf("%+v %v", r, err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("admitted %d of 10 with a share of 1", admitted)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if r, _ := l.Allow(ctx, p, "hot"); r.Allowed {
			t.Fatal("admitted past the share")
		}
	})
	if allocs != 0 {
		t.Errorf("%.2f allocations per denied local decision, want 0", allocs)
	}
}

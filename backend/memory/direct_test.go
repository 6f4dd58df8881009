package memory_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

// runOnly hides the store's direct path: a Limiter over it builds the
// script call (storage key, string ARGV) and goes through Run.
type runOnly struct{ s *memory.Store }

var _ driver.Store = runOnly{}

func (r runOnly) Run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	return r.s.Run(ctx, sc, keys, args)
}

func (runOnly) Local() bool { return true }

func TestRunOnlyHidesDirect(t *testing.T) {
	if _, ok := any(runOnly{}).(driver.DirectStore); ok {
		t.Fatal("runOnly is a DirectStore: the comparisons below would compare the direct path with itself")
	}
}

func newLimiter(t testing.TB, s driver.Store) *core.Limiter {
	t.Helper()
	l, err := core.NewLimiter(s, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestDirectMatchesRun: random sequences of requests — policies of both
// algorithms, several keys, any cost (invalid ones too), pauses from none to
// past expiry — decided on one store by the direct path and the script path
// in random turn, and on a second store by the script path alone, give the
// same results and errors at every step: the typed fast path makes the Lua
// path's decisions and shares its state.
func TestDirectMatchesRun(t *testing.T) {
	var direct, viaRun int
	rapid.Check(t, func(rt *rapid.T) {
		now := storetest.T0
		clock := func() time.Time { return time.UnixMicro(now) }
		mixed, err := memory.New(memory.Options{Clock: clock, MaxBytes: 1 << 20})
		if err != nil {
			rt.Fatal(err)
		}
		defer mixed.Close()
		ref, err := memory.New(memory.Options{Clock: clock, MaxBytes: 1 << 20})
		if err != nil {
			rt.Fatal(err)
		}
		defer ref.Close()
		fast, slow, want := newLimiter(t, mixed), newLimiter(t, runOnly{mixed}), newLimiter(t, runOnly{ref})

		var policies []core.Policy
		for i := range rapid.IntRange(1, 3).Draw(rt, "token_buckets") {
			c := rapid.Int64Range(1, 8).Draw(rt, "capacity")
			rate := rapid.SampledFrom([]float64{1e6, 250_000, 3000, 3, 0.5}).Draw(rt, "rate")
			policies = append(policies, must(tokenbucket.Policy(fmt.Sprint("tb", i), c, rate)))
		}
		for i := range rapid.IntRange(0, 2).Draw(rt, "sliding_windows") {
			lim := rapid.Int64Range(1, 8).Draw(rt, "limit")
			w := rapid.SampledFrom([]time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second}).Draw(rt, "window")
			policies = append(policies, must(slidingwindow.Policy(fmt.Sprint("sw", i), lim, w)))
		}
		keys := []string{"a", "b", strings.Repeat("k", core.MaxKeyLen), "\x00{}:"}
		ctx := context.Background()
		for i := range rapid.IntRange(1, 80).Draw(rt, "steps") {
			p := rapid.SampledFrom(policies).Draw(rt, "policy")
			key := rapid.SampledFrom(keys).Draw(rt, "key")
			cost := rapid.Int64Range(0, p.Limit()+1).Draw(rt, "cost")
			switch rapid.IntRange(0, 3).Draw(rt, "pause_kind") {
			case 1: // a fraction of a refill or window
				now += rapid.Int64Range(0, p.Interval().Microseconds()).Draw(rt, "pause_us")
			case 2: // up to past the key's expiry
				now += rapid.Int64Range(0, (p.Limit()+1)*p.Interval().Microseconds()).Draw(rt, "pause_us")
			case 3:
				now += rapid.Int64Range(0, 10).Draw(rt, "pause_us")
			}
			l := slow
			if rapid.Bool().Draw(rt, "direct") {
				l, direct = fast, direct+1
			} else {
				viaRun++
			}
			got, gerr := l.AllowN(ctx, p, key, cost)
			exp, eerr := want.AllowN(ctx, p, key, cost)
			if fmt.Sprint(gerr) != fmt.Sprint(eerr) {
				rt.Fatalf("step %d (%v key %q cost %d): error %v, want %v", i, p, key, cost, gerr, eerr)
			}
			if got != exp {
				rt.Fatalf("step %d (%v key %q cost %d at +%dµs): %+v, want %+v", i, p, key, cost, now-storetest.T0, got, exp)
			}
		}
	})
	t.Logf("%d direct and %d script decisions on the mixed store, all equal to the script-only store's", direct, viaRun)
}

func must(p core.Policy, err error) core.Policy {
	if err != nil {
		panic(err)
	}
	return p
}

// TestDirectAllocsNothing: deciding on a key the store holds allocates
// nothing on the direct path, admitted or denied, whether its state is live
// or has expired.
func TestDirectAllocsNothing(t *testing.T) {
	now := storetest.T0
	s, err := memory.New(memory.Options{Clock: func() time.Time { return time.UnixMicro(now) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := newLimiter(t, s)
	ctx := context.Background()
	tb := must(tokenbucket.Policy("tb", 2, 1000)) // 1 ms a token
	sw := must(slidingwindow.Policy("sw", 2, time.Millisecond))
	for _, p := range []core.Policy{tb, sw} {
		if _, err := l.Allow(ctx, p, "hot"); err != nil {
			t.Fatal(err)
		}
		var admitted, denied int
		allocs := testing.AllocsPerRun(1000, func() {
			now += 400 // past expiry now and then
			r, err := l.Allow(ctx, p, "hot")
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			} else {
				denied++
			}
		})
		t.Logf("%v: %.2f allocs per decision (%d admitted, %d denied)", p, allocs, admitted, denied)
		if allocs != 0 || admitted == 0 || denied == 0 {
			t.Errorf("%v: %.2f allocs per decision, %d admitted, %d denied; want 0 allocs and both outcomes", p, allocs, admitted, denied)
		}
	}
}

// TestDirectConcurrentBound: goroutines hammering one key through the
// direct path, which reads the clock before the key's lock, never admit
// more than the policy allows over the run (and admit at least half of it:
// a loaded machine may starve the callers).
func TestDirectConcurrentBound(t *testing.T) {
	s, err := memory.New(memory.Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := newLimiter(t, s)
	tb := must(tokenbucket.Policy("tb", 50, 2000))                  // 500 µs a token
	sw := must(slidingwindow.Policy("sw", 50, 20*time.Millisecond)) // 2500 a second
	for _, p := range []core.Policy{tb, sw} {
		const d = 500 * time.Millisecond
		var admitted atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for time.Since(start) < d {
					r, err := l.Allow(context.Background(), p, "hot")
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		span := time.Since(start)
		var bound float64
		if p.Algorithm().Name() == tokenbucket.Name {
			bound = float64(p.Limit()) + float64(span)/float64(p.Interval())
		} else {
			bound = float64(p.Limit()) * float64(span/p.Interval()+1)
		}
		n := float64(admitted.Load())
		t.Logf("%v: admitted %.0f in %v, bound %.1f (%.3f)", p, n, span.Round(time.Millisecond), bound, n/bound)
		if n > bound || n < 0.5*bound {
			t.Errorf("%v: admitted %.0f, want at most the bound %.1f and at least half of it", p, n, bound)
		}
	}
}

// BenchmarkAllowRun is BenchmarkAllow through the script path (storage key,
// string ARGV, Run), for comparison with the direct path.
func BenchmarkAllowRun(b *testing.B) {
	s, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchAllow(b, runOnly{s})
}

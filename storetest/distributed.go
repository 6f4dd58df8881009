package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Recorder is a Store that records the store time of every decision it
// passes through.
type Recorder struct {
	driver.Store
	mu       sync.Mutex
	Admitted []int64 // store time of each admitted unit, microseconds
	DeniedAt []int64 // store time of each denied request, microseconds
}

// Run runs the step and records the decision.
func (r *Recorder) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	raw, err := r.Store.Run(ctx, s, keys, args)
	if err == nil {
		if rep, perr := driver.ParseReply(raw); perr == nil {
			r.mu.Lock()
			if rep.Allowed {
				r.Admitted = append(r.Admitted, rep.Now)
			} else {
				r.DeniedAt = append(r.DeniedAt, rep.Now)
			}
			r.mu.Unlock()
		}
	}
	return raw, err
}

// Hammer drives one key of policy p from `workers` goroutines spread over
// the limiters, for the duration d, and returns the store times of all
// admitted requests (sorted) and the number of errors.
func Hammer(t *testing.T, limiters []*core.Limiter, recs []*Recorder, p core.Policy, key string, workers int, d time.Duration) (admitted []int64, errs int) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := range workers {
		l := limiters[w%len(limiters)]
		wg.Go(func() {
			n := 0
			for time.Now().Before(deadline) && n < 1_000_000 {
				n++
				if _, err := l.Allow(ctx, p, key); err != nil {
					mu.Lock()
					if errs == 0 {
						t.Errorf("Allow: %v", err)
					}
					errs++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, r := range recs {
		admitted = append(admitted, r.Admitted...)
		r.Admitted = nil
	}
	slices.Sort(admitted)
	return admitted, errs
}

// Asked returns the store times of every decision a Hammer made, sorted:
// its admitted times and the denials recs recorded, which it takes from
// them. Fed to a Go twin in this order, they give what one limiter admits
// of the same requests.
func Asked(admitted []int64, recs []*Recorder) []int64 {
	asked := slices.Clone(admitted)
	for _, r := range recs {
		asked = append(asked, r.DeniedAt...)
		r.DeniedAt = nil
	}
	slices.Sort(asked)
	return asked
}

// TokenBucketExcess returns the largest excess, over any span of admitted
// times [a[i], a[j]], of admitted units over capacity + span/interval: a
// positive value means the bucket admitted more than the policy allows.
func TokenBucketExcess(a []int64, capacity, intervalMicros int64) float64 {
	worst := -float64(capacity)
	for i := range a {
		for j := i; j < len(a); j++ {
			n := float64(j - i + 1)
			allow := float64(capacity) + float64(a[j]-a[i])/float64(intervalMicros)
			worst = max(worst, n-allow)
		}
	}
	return worst
}

// WindowMax returns the most admitted units in any window (t-w, t].
func WindowMax(a []int64, w int64) int {
	most, lo := 0, 0
	for hi := range a {
		for a[lo] <= a[hi]-w {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

// RunDistributed is the accuracy test the project is about: `instances`
// Limiters, each over its own store (its own client connection), 64
// goroutines hammering one key for about 3 s. Admitted never exceeds the
// policy's bound. The token bucket reaches at least 95% of it; the windows,
// which pace their admissions, admit exactly what one limiter fed the same
// decisions admits, and at least 80% of the bound (a caller stalled at the
// wrong moment on a loaded machine loses what it did not ask for).
func RunDistributed(t *testing.T, h Harness, instances int, d time.Duration) {
	t.Run("token_bucket", func(t *testing.T) {
		t.Parallel()
		p, _ := tokenbucket.Policy("acc-tb", 100, 200)
		limiters, recs := makeInstances(t, h, instances)
		start := time.Now()
		a, errs := Hammer(t, limiters, recs, p, fmt.Sprint("hot-", seq.Add(1)), 64, d)
		if errs > 0 || len(a) == 0 {
			t.Fatalf("%d errors, %d admitted", errs, len(a))
		}
		span := a[len(a)-1] - a[0]
		bound := float64(p.Limit()) + float64(span)/float64(p.Interval().Microseconds())
		excess := TokenBucketExcess(a, p.Limit(), p.Interval().Microseconds())
		t.Logf("%d instances, %v: admitted %d, bound %.1f (capacity %d + %.0f/s × %.3fs), ratio %.4f, worst sub-span excess %.2f",
			instances, time.Since(start).Round(time.Millisecond), len(a), bound, p.Limit(), tokenbucket.Rate(p), float64(span)/1e6, float64(len(a))/bound, excess)
		if excess > 0 {
			t.Errorf("admitted %.2f units more than capacity + rate × span in some span", excess)
		}
		if float64(len(a)) < 0.95*bound {
			t.Errorf("admitted %d < 95%% of bound %.1f", len(a), bound)
		}
	})
	t.Run("sliding_window", func(t *testing.T) {
		t.Parallel()
		p, _ := slidingwindow.Policy("acc-sw", 50, 500*time.Millisecond)
		limiters, recs := makeInstances(t, h, instances)
		a, errs := Hammer(t, limiters, recs, p, fmt.Sprint("hot-", seq.Add(1)), 64, d)
		if errs > 0 || len(a) == 0 {
			t.Fatalf("%d errors, %d admitted", errs, len(a))
		}
		w := p.Interval().Microseconds()
		most := WindowMax(a, w)
		span := a[len(a)-1] - a[0]
		// [a0, a0+k·W) holds k whole windows: at most limit·k there. The
		// window that was filling when the run stopped counts toward the
		// upper bound only.
		k := span / w
		whole := 0
		for _, x := range a {
			if x < a[0]+k*w {
				whole++
			}
		}
		// One log fed every decision, admitted or denied, in store time:
		// what the instances should have admitted, however the machine
		// scheduled their callers. A unit re-admits only when the one it
		// replaces leaves the window, so a stall shifts every later
		// admission and pushes some past the whole windows.
		asked := Asked(a, recs)
		var log slidingwindow.Log
		ideal := 0
		for _, at := range asked {
			if slidingwindow.Decide(&log, at, p.Limit(), w, 1)[0] == 1 {
				ideal++
			}
		}
		t.Logf("%d instances: admitted %d in %d whole windows of limit %d (bound %d), %d in all; one log fed the %d decisions admits %d; most in one window %d",
			instances, whole, k, p.Limit(), k*p.Limit(), len(a), len(asked), ideal, most)
		if most > int(p.Limit()) {
			t.Errorf("%d admitted in one window, limit %d", most, p.Limit())
		}
		if int64(len(a)) > p.Limit()*(k+1) {
			t.Errorf("admitted %d > limit × %d windows", len(a), k+1)
		}
		if len(a) != ideal {
			t.Errorf("admitted %d, one log fed the same %d decisions admits %d", len(a), len(asked), ideal)
		}
		if k < 2 || float64(whole) < 0.80*float64(k*p.Limit()) {
			t.Errorf("admitted %d in %d whole windows, want at least 80%% of %d", whole, k, k*p.Limit())
		}
	})
	t.Run("sliding_window_counter", func(t *testing.T) {
		t.Parallel()
		distributedSlidingCounter(t, h, instances, d)
	})
}

func makeInstances(t *testing.T, h Harness, n int) ([]*core.Limiter, []*Recorder) {
	var ls []*core.Limiter
	var rs []*Recorder
	for range n {
		r := &Recorder{Store: h.MakeStore(t)}
		l, err := core.NewLimiter(r, core.Options{Prefix: "acc:"})
		if err != nil {
			t.Fatal(err)
		}
		ls, rs = append(ls, l), append(rs, r)
	}
	return ls, rs
}

// BenchAllow measures Limiter.Allow on store s: one hot key, and 100k keys
// drawn in turn. The policy never runs dry, so every call does the full
// admit path.
func BenchAllow(b *testing.B, s driver.Store) {
	l, err := core.NewLimiter(s, core.Options{Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	p, err := tokenbucket.Policy("bench", 1_000_000, 1_000_000)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	for _, bc := range []struct {
		name string
		keys []string
	}{{"hot_key", keys[:1]}, {"100k_keys", keys}} {
		b.Run(bc.name, func(b *testing.B) {
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					k := bc.keys[int(next.Add(1))%len(bc.keys)]
					if _, err := l.Allow(ctx, p, k); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

package harness

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/bench/stats"
)

// makeKeys returns n client keys "k000000", "k000001", ...
func makeKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + pad6(i)
	}
	return keys
}

func pad6(i int) string {
	s := strconv.Itoa(i)
	for len(s) < 6 {
		s = "0" + s
	}
	return s
}

// loadSpec is one closed-loop run: G callers, each calling decide as fast as
// it answers, for Duration or MaxOps decisions in all, whichever comes
// first.
type loadSpec struct {
	G        int
	Duration time.Duration
	MaxOps   int64
	Keys     []string // the hot key is Keys[0] when Hot
	Hot      bool
	Seed     uint64
}

// loadResult is what one run measured.
type loadResult struct {
	Ops      int64
	Errs     int64
	Allowed  int64
	Degraded int64
	Elapsed  time.Duration
	Hist     stats.Hist
	FirstErr error
}

// PerSec is decisions per second over the run.
func (r *loadResult) PerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// runLoad runs spec against decide. Every decision is timed; the time
// includes the key choice's few nanoseconds.
func runLoad(ctx context.Context, spec loadSpec, decide decideFunc) *loadResult {
	var stop atomic.Bool
	perWorker := max(spec.MaxOps/int64(spec.G), 1)
	type worker struct {
		hist                         stats.Hist
		ops, errs, allowed, degraded int64
		firstErr                     error
	}
	ws := make([]worker, spec.G)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range ws {
		w := &ws[i]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(spec.Seed, uint64(i)))
			n := len(spec.Keys)
			for w.ops < perWorker && !stop.Load() {
				key := spec.Keys[0]
				if !spec.Hot {
					key = spec.Keys[rng.IntN(n)]
				}
				t0 := time.Now()
				o, err := decide(ctx, key)
				w.hist.Record(time.Since(t0))
				w.ops++
				if err != nil {
					w.errs++
					if w.firstErr == nil {
						w.firstErr = err
					}
					continue
				}
				if o&allowed != 0 {
					w.allowed++
				}
				if o&degraded != 0 {
					w.degraded++
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(spec.Duration):
	case <-ctx.Done():
	}
	stop.Store(true)
	<-done
	r := &loadResult{Elapsed: time.Since(start)}
	for i := range ws {
		w := &ws[i]
		r.Hist.Merge(&w.hist)
		r.Ops += w.ops
		r.Errs += w.errs
		r.Allowed += w.allowed
		r.Degraded += w.degraded
		if r.FirstErr == nil {
			r.FirstErr = w.firstErr
		}
	}
	return r
}

package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// localCell names one local-path configuration.
type localCell struct {
	Impl  string
	Procs int
	Hot   bool
}

// localStat is one run: wall time per decision (with Procs goroutines
// deciding at once, as testing's RunParallel reports it), and heap
// allocations per decision.
type localStat struct {
	NsPerOp     float64
	AllocsPerOp float64
	BytesPerOp  float64
	Ops         int64
	Allowed     int64
	Errs        int64
}

type localResult struct {
	Impls []string
	Procs []int
	Runs  map[localCell][]localStat
}

// local runs section 2: each repetition runs every limiter once in turn.
func (h *harness) local(ctx context.Context) error {
	impls := selectImpls(localImpls(), h.cfg.Impls)
	res := &localResult{Procs: h.cfg.Procs, Runs: map[localCell][]localStat{}}
	h.report.Local = res
	deciders, closeAll, err := h.openAll(ctx, impls)
	if err != nil {
		return err
	}
	defer closeAll()
	for _, im := range impls {
		res.Impls = append(res.Impls, im.name)
	}
	keys := makeKeys(h.cfg.Keys)
	// Every limiter sees every key once before measuring, so the 100k-key
	// runs measure lookups of known keys, not insertions.
	for i, d := range deciders {
		t0 := time.Now()
		for _, k := range keys {
			if _, err := d(ctx, k); err != nil {
				return err
			}
		}
		h.progress("local %-44s saw %d keys in %v", impls[i].name, len(keys), time.Since(t0).Round(time.Millisecond))
	}
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	for _, procs := range h.cfg.Procs {
		runtime.GOMAXPROCS(procs)
		for _, hot := range h.cfg.keysets() {
			for rep := range h.cfg.Reps {
				for i, im := range impls {
					st := localLoop(ctx, deciders[i], procs, keys, hot, h.cfg.LocalDuration, uint64(rep))
					if st.Errs > 0 {
						return fmt.Errorf("%s: %d errors", im.name, st.Errs)
					}
					c := localCell{Impl: im.name, Procs: procs, Hot: hot}
					res.Runs[c] = append(res.Runs[c], st)
					h.progress("local %-44s procs %d %-9s rep %d: %7.1f ns/op %5.2f allocs/op %6.1f B/op",
						im.name, procs, keysetName(hot), rep+1, st.NsPerOp, st.AllocsPerOp, st.BytesPerOp)
				}
			}
		}
	}
	return nil
}

// localLoop runs procs goroutines deciding as fast as they can for d.
func localLoop(ctx context.Context, decide decideFunc, procs int, keys []string, hot bool, d time.Duration, seed uint64) localStat {
	// Warm up: a tenth of the run, unmeasured.
	localRun(ctx, decide, procs, keys, hot, d/10, seed+1000)
	// No runtime.GC() here: with every limiter's 100k keys the heap is
	// large and a forced collection takes longer than the run. Collections
	// during the run are part of what allocating costs.
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	ops, ok, errs := localRun(ctx, decide, procs, keys, hot, d, seed)
	elapsed := time.Since(start)
	runtime.ReadMemStats(&m1)
	st := localStat{Ops: ops, Allowed: ok, Errs: errs}
	if ops > 0 {
		st.NsPerOp = float64(elapsed.Nanoseconds()) / float64(ops)
		st.AllocsPerOp = float64(m1.Mallocs-m0.Mallocs) / float64(ops)
		st.BytesPerOp = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(ops)
	}
	return st
}

func localRun(ctx context.Context, decide decideFunc, procs int, keys []string, hot bool, d time.Duration, seed uint64) (ops, ok, errs int64) {
	var stop atomic.Bool
	var nOps, nOK, nErr atomic.Int64
	limit := int64(d.Seconds()*maxOpsPerSec) + 1
	var wg sync.WaitGroup
	for w := range procs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			var n, good, bad int64
			for n < limit && !stop.Load() {
				key := keys[0]
				if !hot {
					key = keys[rng.IntN(len(keys))]
				}
				o, err := decide(ctx, key)
				n++
				if err != nil {
					bad++
				} else if o&allowed != 0 {
					good++
				}
			}
			nOps.Add(n)
			nOK.Add(good)
			nErr.Add(bad)
		})
	}
	t := time.AfterFunc(d, func() { stop.Store(true) })
	wg.Wait()
	t.Stop()
	return nOps.Load(), nOK.Load(), nErr.Load()
}

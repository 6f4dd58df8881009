package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/bench/redisproc"
	"github.com/holdfast/holdfast/bench/stats"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
)

// Faults of section 3.
const (
	faultKill = "SIGKILL"
	faultStop = "SIGSTOP"
)

type outageCell struct {
	Backend string
	Fault   string
}

// outageStat is one fault: the latency of every decision that started in
// the window after it.
type outageStat struct {
	P50, P99, Max time.Duration
	Ops, Errs     int64
	Degraded      int64
	OverDeadline  int64 // decisions slower than the call deadline
	Recovery      time.Duration
}

type outageResult struct {
	Backends    []string
	Faults      []string
	Window      time.Duration
	CallTimeout time.Duration
	G           int
	Pace        time.Duration
	Reps        int
	Runs        map[outageCell][]outageStat
}

// outage runs section 3 on a redis-server of its own: for each repetition,
// backend and fault, paced callers decide through fallback.Limiter while
// Redis is killed (then restarted empty) or stopped (then continued).
func (h *harness) outage(ctx context.Context) error {
	res := &outageResult{
		Backends: h.cfg.OutageBackends, Faults: []string{faultKill, faultStop},
		Window: h.cfg.OutageWindow, CallTimeout: h.cfg.CallTimeout, G: h.cfg.OutageG, Pace: h.cfg.OutagePace,
		Runs: map[outageCell][]outageStat{},
	}
	h.report.Outage = res
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	pol, err := hiTB()
	if err != nil {
		return err
	}
	type limiterOn struct {
		l     *fallback.Limiter
		close func()
	}
	ls := map[string]limiterOn{}
	defer func() {
		for _, lo := range ls {
			_ = lo.l.Close()
			lo.close()
		}
	}()
	for _, b := range res.Backends {
		mk := rueidisStore
		if b == "go-redis" {
			mk = goredisStore
		}
		store, closeStore, err := mk(srv.URL())
		if err != nil {
			return err
		}
		l, err := fallback.New(store, fallback.Options{ID: "bench-" + b, Logger: discard, Breaker: fallback.BreakerOptions{CallTimeout: h.cfg.CallTimeout}})
		if err != nil {
			closeStore()
			return err
		}
		if err := l.Start(ctx); err != nil {
			closeStore()
			return err
		}
		ls[b] = limiterOn{l: l, close: closeStore}
	}
	keys := makeKeys(1000)
	reps := h.cfg.OutageReps
	if reps <= 0 {
		reps = h.cfg.Reps
	}
	res.Reps = reps
	for rep := range reps {
		for _, b := range res.Backends {
			for _, f := range res.Faults {
				st, err := h.fault(ctx, srv, ls[b].l, pol, keys, f, uint64(rep))
				if errors.Is(err, errNotClosed) {
					h.note("outage %s %s run %d: %v", b, f, rep+1, err)
					if st.Ops == 0 {
						continue // not measured: the limiter never got healthy
					}
				} else if err != nil {
					return fmt.Errorf("%s %s: %w", b, f, err)
				}
				c := outageCell{Backend: b, Fault: f}
				res.Runs[c] = append(res.Runs[c], st)
				h.progress("outage %-8s %s rep %d: p50 %-9v p99 %-9v max %-9v over deadline %d of %d, degraded %d, errs %d, back to Redis after %v",
					b, f, rep+1, st.P50, st.P99, st.Max, st.OverDeadline, st.Ops, st.Degraded, st.Errs, st.Recovery.Round(time.Millisecond))
			}
		}
	}
	return nil
}

// fault measures one fault. The limiter must be healthy (breaker closed)
// first; the callers warm up for outageWarm, the fault is injected, every
// decision started in the window is recorded, and then Redis is brought
// back and the breaker is waited for.
func (h *harness) fault(ctx context.Context, srv *redisproc.Server, l *fallback.Limiter, pol core.Policy, keys []string, fault string, seed uint64) (outageStat, error) {
	if err := waitClosed(ctx, l, 20*time.Second); err != nil {
		return outageStat{}, err
	}
	var phase atomic.Int32 // 0 warm, 1 recording, 2 stop
	hists := make([]stats.Hist, h.cfg.OutageG)
	var ops, errs, degr, over atomic.Int64
	var wg sync.WaitGroup
	deadline := h.cfg.CallTimeout
	for w := range h.cfg.OutageG {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			next := time.Now()
			for n := 0; n < 1<<24; n++ { // bounded: at most 16M calls per caller
				ph := phase.Load()
				if ph == 2 {
					return
				}
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				} else if d < -h.cfg.OutagePace {
					next = time.Now() // behind after a slow call: no catch-up burst
				}
				next = next.Add(h.cfg.OutagePace)
				t0 := time.Now()
				r, err := l.Allow(ctx, pol, keys[rng.IntN(len(keys))])
				took := time.Since(t0)
				if ph != 1 {
					continue
				}
				hists[w].Record(took)
				ops.Add(1)
				if err != nil {
					errs.Add(1)
				} else if r.Degraded {
					degr.Add(1)
				}
				if took > deadline {
					over.Add(1)
				}
			}
		})
	}
	stopAll := func() { phase.Store(2); wg.Wait() }
	sleepCtx(ctx, outageWarm)
	phase.Store(1)
	var err error
	if fault == faultKill {
		srv.Kill()
	} else {
		err = srv.Pause()
	}
	if err != nil {
		stopAll()
		return outageStat{}, err
	}
	sleepCtx(ctx, h.cfg.OutageWindow)
	phase.Store(0) // keep the load on through the recovery, unrecorded
	back := time.Now()
	if fault == faultKill {
		err = srv.Restart()
	} else {
		err = srv.Resume()
	}
	if err == nil {
		err = waitClosed(ctx, l, 20*time.Second)
	}
	recovery := time.Since(back)
	stopAll()
	if err != nil && !errors.Is(err, errNotClosed) {
		return outageStat{}, err
	}
	var all stats.Hist
	for i := range hists {
		all.Merge(&hists[i])
	}
	return outageStat{
		P50: all.Quantile(0.5), P99: all.Quantile(0.99), Max: all.Max(),
		Ops: ops.Load(), Errs: errs.Load(), Degraded: degr.Load(), OverDeadline: over.Load(),
		Recovery: recovery,
	}, err
}

// errNotClosed reports a breaker that did not close in time.
var errNotClosed = errors.New("breaker not closed")

// outageWarm is how long the callers run through Redis before a fault.
const outageWarm = 500 * time.Millisecond

// waitClosed waits until l's breaker is closed (decisions go to Redis).
func waitClosed(ctx context.Context, l *fallback.Limiter, limit time.Duration) error {
	end := time.Now().Add(limit)
	for l.Breaker().State() != fallback.Closed {
		if time.Now().After(end) {
			return fmt.Errorf("%w: still %v after %v", errNotClosed, l.Breaker().State(), limit)
		}
		sleepCtx(ctx, 20*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

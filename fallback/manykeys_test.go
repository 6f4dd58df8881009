package fallback_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// TestOutageManyKeys kills Redis under load above the limit on 100 keys
// and restarts it empty: each instance's replay then has a batch for most
// keys, past reconcile's FreshMin, so the keys Redis lost are written by
// fresh calls and the batches of the other instances merge into what
// those wrote. Over the whole run every key stays within 105% of the
// policy's bound, and the keys together admit at least 85% of what the
// instances' shares allow: what exact limiters admit, for the part of
// the run the instances decide through Redis, and what their leases can
// admit of it (shareUse) for the part they decide locally. No caller sees
// an error, and every instance goes open, reconciling, closed.
//
// Eight workers fill every key within the first half second even on a
// loaded machine, well before the kill at 1.5 s. With four, a slow run
// filled the sliding windows only as Redis died (1.25-1.5 s): the
// windows' known states then had their newest units at the kill, and a
// lease started from such a state (which holds every unit at its newest
// time: never more than Redis would admit) admitted nothing for most of a
// window, which dropped the run to 0.70-0.82 of the ideal at e34e80a and
// after, against 0.900 when the keys were full earlier. That is the
// seed's conservatism, which this floor does not model.
func TestOutageManyKeys(t *testing.T) {
	tb, _ := tokenbucket.Policy("mtb", 5, 5)
	sw, _ := slidingwindow.Policy("msw", 10, 2*time.Second)
	for _, tc := range []struct {
		backend string
		p       core.Policy
	}{{"goredis", tb}, {"rueidis", tb}, {"goredis", sw}, {"rueidis", sw}} {
		t.Run(tc.backend+"/"+tc.p.Algorithm().Name(), func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			in := startInstances(t, tc.backend, srv.URL(), 4, "")
			time.Sleep(300 * time.Millisecond) // every instance has heartbeated: N = 4
			const keys = 100
			ctx, cancel := killRun(t, srv)
			defer cancel()
			var ld load
			per := make([]atomic.Int64, keys)
			start := time.Now()
			in.driveKeys(ctx, tc.p, keys, 8, time.Millisecond, &ld, per)
			took := time.Since(start)
			b := bound(tc.p, took)
			ideal, _ := tc.p.Algorithm().(driver.Quotaer).Bound(tc.p, took)
			worst := int64(0)
			for k := range per {
				worst = max(worst, per[k].Load())
			}
			ratio := float64(ld.admitted.Load()) / (keys * b)
			floor := float64(ld.admitted.Load()) / (keys * ideal)
			// What the instances' shares allow of the ideal: all of it
			// while they decide through Redis, and while they decide
			// locally what their leases can admit of a share.
			local := in.notClosed(start, start.Add(took))
			allow := 1 - local + local*shareUse(t, tc.p, len(in.lims))
			t.Logf("admitted %d denied %d errors %d in %v over %d keys: bound %.1f a key, ratio %.3f, %.3f of the ideal, most on one key %d; %.0f%% of the run local, where the shares allow %.3f of the ideal",
				ld.admitted.Load(), ld.denied.Load(), ld.errors.Load(), took.Round(time.Millisecond), keys, b, ratio, floor, worst, 100*local, allow)
			record(fmt.Sprintf("kill -9 for 3 s, restart empty, %d keys", keys), tc.backend, tc.p, &ld, keys*b)
			if ld.errors.Load() != 0 {
				t.Errorf("%d errors reached callers", ld.errors.Load())
			}
			if float64(worst) > 1.05*b+1 {
				t.Errorf("a key admitted %d, past 105%% of its bound %.1f", worst, b)
			}
			if ratio > 1.05 || floor < 0.85*allow {
				t.Errorf("admitted/bound = %.3f, want at most 1.05; admitted/ideal = %.3f, want at least 85%% of the %.3f the shares allow", ratio, floor, allow)
			}
			in.checkRecovered(t)
		})
	}
}

// notClosed is the share of [from, to] the instances spent, on average,
// deciding locally: from their breaker's opening to its closing again.
func (in *instances) notClosed(from, to time.Time) float64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	var local time.Duration
	for i := range in.seen {
		var since time.Time // zero while closed
		for j, st := range in.seen[i] {
			at := in.at[i][j]
			if at.Before(from) {
				at = from
			} else if at.After(to) {
				at = to
			}
			switch {
			case st == fallback.Closed && !since.IsZero():
				local += at.Sub(since)
				since = time.Time{}
			case st != fallback.Closed && since.IsZero():
				since = at
			}
		}
		if !since.IsZero() {
			local += to.Sub(since)
		}
	}
	return float64(local) / float64(len(in.seen)) / float64(to.Sub(from))
}

// shareUse is the share of what one exact limiter of p admits that the
// leases of n instances admit together while each decides locally, as
// the algorithm's own lease decides it (driver.Leaser): one lease of the
// 1/n share, asked every 1 ms for 100 of p's windows, times n, over the
// exact limiter's count (driver.Quotaer.Bound). A sliding window lease
// admits whole units of limit/n (0.8 for 10 over 4 instances); a token
// bucket lease keeps fractions of a token (1).
func shareUse(t *testing.T, p core.Policy, n int) float64 {
	la, ok1 := p.Algorithm().(driver.Leaser)
	qa, ok2 := p.Algorithm().(driver.Quotaer)
	if !ok1 || !ok2 {
		t.Fatalf("%s: no lease or quota to measure its shares by", p.Algorithm().Name())
	}
	_, w := qa.Quota(p)
	span := 100 * w
	const start = int64(1_700_000_000_000_000) // µs
	l := la.NewLease(p, driver.Seed{}, start)
	admitted := 0
	for at := start; at < start+span.Microseconds(); at += 1000 {
		if l.Decide(p, int64(n), at, 1).Allowed {
			admitted++
		}
	}
	ideal, _ := qa.Bound(p, span)
	return min(1, float64(admitted*n)/ideal)
}

// driveKeys is drive over keys client-0 … client-(keys-1), each request
// the next key, counting each key's admissions in per.
func (in *instances) driveKeys(ctx context.Context, p core.Policy, keys, workers int, pause time.Duration, ld *load, per []atomic.Int64) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				n := next.Add(1)
				l, k := in.lims[n%int64(len(in.lims))], int(n/int64(len(in.lims)))%keys
				start := time.Now()
				r, err := l.Allow(context.Background(), p, fmt.Sprint("client-", k))
				ld.observe(time.Since(start))
				switch {
				case err != nil:
					ld.errors.Add(1)
				case r.Allowed:
					ld.admitted.Add(1)
					per[k].Add(1)
				default:
					ld.denied.Add(1)
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
}

package fallback_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// Redis answering wrong (docs/DESIGN.md, "The fault model"): the server is
// up and replies at once, but every write is refused with an error reply
// that means it cannot serve now. Each fault comes from internal/redistest,
// is in place once a script write fails with its prefix and lifted once one
// succeeds again. The limiter must treat it as an outage: the breaker
// opens, requests are decided from leases, no caller sees an error, and the
// breaker closes only once writes work again (the probe is a write).

// The run: load for replyNormal, the fault for replyFaultFor (LOADING: as long
// as the server loads, about as long), load for replyAfter once lifted.
const (
	replyNormal   = 2 * time.Second
	replyFaultFor = 5 * time.Second
	replyAfter    = 3500 * time.Millisecond // a run of about 10.5 s: half a window past the last whole one, where the sliding window's bound is tight
)

// A replyFault is one way of answering wrong.
type replyFault struct {
	name string // subtest name
	row  string // docs/RELIABILITY.md's fault column
	code string // the error reply's code, which Status.LastError must name
	opts []redistest.Option
	// inject puts the fault in place and returns lift, which keeps it for
	// replyFaultFor, lifts it and returns the last moment it was known in
	// place.
	inject func(t *testing.T, srv *redistest.Server) (lift func() time.Time)
	// sw: also run the sliding window.
	sw bool
	// alone: no other subtest with alone runs at the same time.
	alone bool
}

// aloneMu serialises the subtests of replyFaults with alone.
var aloneMu sync.Mutex

// held makes inject of a fault that lasts until undone.
func held(put func(*redistest.Server, testing.TB) (undo func())) func(*testing.T, *redistest.Server) func() time.Time {
	return func(t *testing.T, srv *redistest.Server) func() time.Time {
		undo := put(srv, t)
		return func() time.Time {
			time.Sleep(replyFaultFor)
			on := time.Now()
			undo()
			return on
		}
	}
}

var replyFaults = []replyFault{
	{name: "oom", code: "OOM", row: "OOM (maxmemory 1) for 5 s", sw: true, inject: held((*redistest.Server).OutOfMemory)},
	{name: "readonly", code: "READONLY", row: "READONLY (replica of a dead master) for 5 s", sw: true, inject: held((*redistest.Server).ReadOnlyReplica)},
	{name: "noperm", code: "NOPERM", row: "NOPERM (ACL -eval -evalsha) for 5 s", inject: held((*redistest.Server).DenyScripts)},
	{name: "wrongpass", code: "WRONGPASS", row: "WRONGPASS (password changed, clients killed) for 5 s", inject: held((*redistest.Server).RotatePassword),
		opts: []redistest.Option{redistest.WithPassword("holdfast test")}},
	// The spinning script keeps one of the machine's cores busy: two at
	// once would leave the instances none.
	{name: "busy", code: "BUSY", row: "BUSY (a script spinning) for 5 s", alone: true, inject: held((*redistest.Server).BusyScript)},
	{name: "misconf", code: "MISCONF", row: "MISCONF (background save failed) for 5 s", inject: held((*redistest.Server).FailedSave)},
	{name: "loading", code: "LOADING", row: "LOADING (restart on a data set loading for 5 s)", inject: func(t *testing.T, srv *redistest.Server) func() time.Time {
		return srv.SlowLoad(t, replyFaultFor)
	}},
}

// faultRun is what one run under a fault measured.
type faultRun struct {
	ld        load
	took      time.Duration // the whole run
	injecting time.Time     // when the fault began to be put in place
	lastOn    time.Time     // the last moment it was known in place
	lifted    time.Time     // when it was known lifted
	// reasons holds, per instance, the reasons of Status.LastError seen
	// while the fault was in place.
	reasons []map[string]bool
}

// runFault drives the load of TestOutage (4 workers, a request every 2 ms
// each, round-robin, one key far above its limit) for normal, then calls
// inject and the lift it returns, then drives it for after more. inject and
// lift run on the test's goroutine.
func (in *instances) runFault(t *testing.T, p core.Policy, normal, after time.Duration, inject func() (lift func() time.Time)) *faultRun {
	t.Helper()
	r := &faultRun{reasons: make([]map[string]bool, len(in.lims))}
	for i := range r.reasons {
		r.reasons[i] = map[string]bool{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	drove := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(drove)
		in.drive(ctx, p, "client-1", 4, 2*time.Millisecond, &r.ld)
		r.took = time.Since(start)
	}()
	defer func() { cancel(); <-drove }() // also when inject fails the test
	time.Sleep(normal)
	r.injecting = time.Now()
	lift := inject()
	sampling, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			for i, l := range in.lims {
				if e := l.Status().LastError; e != nil && e.At.After(r.injecting) {
					r.reasons[i][e.Reason] = true
				}
			}
			select {
			case <-sampling:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	r.lastOn = lift()
	close(sampling)
	<-sampled
	r.lifted = time.Now()
	time.Sleep(after)
	cancel()
	<-drove
	return r
}

// waitLive waits until every instance counts all of them live.
func (in *instances) waitLive(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for i, l := range in.lims {
		for l.Status().Instances != int64(len(in.lims)) {
			if time.Now().After(deadline) {
				t.Fatalf("app%d counts %d live instances, want %d", i+1, l.Status().Instances, len(in.lims))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// checkFaultPath waits until every instance is closed with an empty outage
// log, then asserts each went Open after the fault began to be put in
// place (not before, but for one trip a loaded machine made and that had
// ended when the fault came), and left Open (Reconciling, Closed) only
// after the last moment the fault was known in place.
func (in *instances) checkFaultPath(t *testing.T, r *faultRun) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i, l := range in.lims {
		for st := l.Status(); st.Breaker != "closed" || st.PendingLog > 0; st = l.Status() {
			if time.Now().After(deadline) {
				t.Errorf("app%d not recovered %v after the fault was lifted: %+v", i+1, time.Since(r.lifted).Round(time.Millisecond), st)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for i := range in.lims {
		seen, at := in.seen[i], in.at[i]
		path := ""
		for j, s := range seen {
			path += fmt.Sprintf(" %v@%+.3fs", s, at[j].Sub(r.injecting).Seconds())
		}
		last := "none"
		if e := in.lims[i].Status().LastError; e != nil {
			last = fmt.Sprintf("%s %s %+.3fs", e.Class, e.Reason, e.At.Sub(r.injecting).Seconds())
		}
		t.Logf("app%d:%s (times from the fault's start; known in place until %+.3fs, lifted at %+.3fs; last failed call: %s)", i+1, path,
			r.lastOn.Sub(r.injecting).Seconds(), r.lifted.Sub(r.injecting).Seconds(), last)
		// Before the fault, one trip and its recovery is the breaker
		// working as designed on a loaded machine (the race detector,
		// parallel tests): three calls past the deadline in a row, which
		// at the default 50 ms a stalled process can make. More, or a
		// breaker not closed when the fault came, is a failure.
		k := 0
		for k < len(seen) && at[k].Before(r.injecting) {
			k++
		}
		if k > 0 {
			if k > 3 || seen[k-1] != fallback.Closed {
				t.Errorf("app%d went through %v before the fault, want at most one trip and closed when it came", i+1, seen[:k])
				continue
			}
			t.Logf("app%d tripped %v before the fault and was closed again when it came", i+1, r.injecting.Sub(at[0]).Round(time.Millisecond))
			seen, at = seen[k:], at[k:]
		}
		if len(seen) == 0 || seen[0] != fallback.Open {
			t.Errorf("app%d went through %v, want Open first", i+1, seen)
			continue
		}
		for j, s := range seen {
			if s != fallback.Open && at[j].Before(r.lastOn) {
				t.Errorf("app%d went %v %v before the fault was lifted", i+1, s, r.lastOn.Sub(at[j]).Round(time.Millisecond))
			}
		}
	}
}

// TestReplyFault: each error-reply fault for 5 s under load above the
// limit, on both backends (token bucket; the sliding window too for OOM and
// READONLY): over the whole run the instances admit between 90% and 105%
// of the bound, no caller sees an error, every instance goes Open when the
// fault comes and back to Closed only after it went, with its log
// replayed.
func TestReplyFault(t *testing.T) {
	t.Parallel()
	tb, _ := tokenbucket.Policy("tb", 10, 20)
	sw, _ := slidingwindow.Policy("sw", 20, time.Second)
	// Backends outside, faults inside: at most two subtests run at once,
	// and the two BUSY ones (each spins a core) never together.
	for _, backend := range []string{"goredis", "rueidis"} {
		for _, f := range replyFaults {
			ps := []core.Policy{tb}
			if f.sw {
				ps = append(ps, sw)
			}
			for _, p := range ps {
				t.Run(fmt.Sprintf("%s/%s/%s", f.name, backend, p.Algorithm().Name()), func(t *testing.T) {
					t.Parallel()
					if f.alone {
						aloneMu.Lock()
						defer aloneMu.Unlock()
					}
					srv := redistest.Start(t, f.opts...)
					in := startInstances(t, backend, srv.URL(), 4, "")
					in.waitLive(t)
					r := in.runFault(t, p, replyNormal, replyAfter, func() func() time.Time { return f.inject(t, srv) })
					b := bound(p, r.took)
					ratio := float64(r.ld.admitted.Load()) / b
					record(f.row, backend, p, &r.ld, b)
					t.Logf("admitted %d denied %d errors %d in %v: bound %.1f, ratio %.3f; fault on for %v; slowest decision %v",
						r.ld.admitted.Load(), r.ld.denied.Load(), r.ld.errors.Load(), r.took.Round(time.Millisecond), b, ratio,
						r.lifted.Sub(r.injecting).Round(time.Millisecond), time.Duration(r.ld.worst.Load()).Round(time.Millisecond))
					if n := r.ld.errors.Load(); n != 0 {
						t.Errorf("%d errors reached callers", n)
					}
					if ratio > 1.05 || ratio < 0.9 {
						t.Errorf("admitted/bound = %.3f, want within [0.9, 1.05]", ratio)
					}
					in.checkFaultPath(t, r)
					for i, seen := range r.reasons {
						if !seen[f.code] {
							t.Errorf("app%d: the failed calls' reasons while the fault was in place were %v, want %s among them", i+1, seen, f.code)
						}
					}
				})
			}
		}
	}
}

// newDefaultStore is newStore with the clients' default deadlines.
func newDefaultStore(t *testing.T, backend, url string) driver.Store {
	t.Helper()
	switch backend {
	case "goredis":
		c, err := goredis.NewClient(url, goredis.ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	case "rueidis":
		c, err := rueidis.NewClient(url, rueidis.ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return rueidis.New(c)
	}
	t.Fatalf("unknown backend %q", backend)
	return nil
}

// TestFrozenDefaultDeadline freezes Redis for 6 s under load, with every
// deadline at its default (the breaker's 50 ms call deadline, the clients'
// own timeouts): calls sent to the frozen Redis time out and are decided
// locally, and when Redis resumes it runs them late; the deadline guard
// refuses them there, so they spend no quota. Two freezes: SIGSTOP (nothing
// answers), and CLIENT PAUSE WRITE (PING, reads and new connections'
// handshakes are answered; every script, the probe's too, is held). The
// instances admit at least 95% of what one exact limiter admits from the
// start (the bound, for the token bucket) and at most 105% of the bound, no
// caller sees an error, no decision waits much past the deadline, and the
// breakers close only after the resume.
func TestFrozenDefaultDeadline(t *testing.T) {
	t.Parallel()
	const deadline = 50 * time.Millisecond // fallback.BreakerOptions' default CallTimeout
	tb, _ := tokenbucket.Policy("tb", 10, 20)
	sc, _ := slidingcounter.Policy("sc", 20, time.Second)
	const frozen = 6 * time.Second
	for _, tc := range []struct {
		backend string
		p       core.Policy
		pause   bool // CLIENT PAUSE WRITE, not SIGSTOP
	}{{"goredis", tb, false}, {"rueidis", tb, false}, {"goredis", sc, false}, {"rueidis", sc, false}, {"goredis", tb, true}, {"rueidis", tb, true}} {
		backend, tb, pause := tc.backend, tc.p, tc.pause
		name := backend
		if tb.Algorithm() != tokenbucket.Algorithm {
			name += "/" + tb.Algorithm().Name()
		}
		row := "SIGSTOP for 6 s, default 50 ms deadline"
		if pause {
			name += "/pause"
			row = "CLIENT PAUSE WRITE for 6 s (PING answered), default 50 ms deadline"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			urls := []string{srv.URL(), srv.URL(), srv.URL(), srv.URL()}
			in := startInstancesWith(t, urls, "", 0, func(url string) driver.Store { return newDefaultStore(t, backend, url) })
			in.waitLive(t)
			r := in.runFault(t, tb, replyNormal, replyAfter, func() func() time.Time {
				if pause {
					// The pause would end by itself a little after
					// frozen; the undo ends it at frozen.
					undo := srv.PauseWrites(t, frozen+2*time.Second)
					return func() time.Time {
						time.Sleep(frozen)
						on := time.Now()
						undo()
						return on
					}
				}
				srv.Pause()
				return func() time.Time {
					time.Sleep(frozen)
					on := time.Now()
					srv.Resume()
					return on
				}
			})
			b := bound(tb, r.took)
			ratio := float64(r.ld.admitted.Load()) / b
			ideal, _ := tb.Algorithm().(driver.Quotaer).Bound(tb, r.took)
			floor := float64(r.ld.admitted.Load()) / ideal
			worst := time.Duration(r.ld.worst.Load())
			record(row, backend, tb, &r.ld, b)
			t.Logf("admitted %d denied %d errors %d in %v: bound %.1f, ratio %.3f, %.3f of the ideal %.1f; slowest decision %v (call deadline %v)",
				r.ld.admitted.Load(), r.ld.denied.Load(), r.ld.errors.Load(), r.took.Round(time.Millisecond), b, ratio, floor, ideal, worst.Round(time.Millisecond), deadline)
			if n := r.ld.errors.Load(); n != 0 {
				t.Errorf("%d errors reached callers", n)
			}
			// A stall bound, as TestBlackHole's, not a speed figure.
			if worst > deadline+400*time.Millisecond {
				t.Errorf("a decision took %v; the call deadline is %v", worst, deadline)
			}
			if ratio > 1.05 || floor < 0.95 {
				t.Errorf("admitted/bound = %.3f, want at most 1.05; admitted/ideal = %.3f, want at least 0.95", ratio, floor)
			}
			in.checkFaultPath(t, r)
		})
	}
}

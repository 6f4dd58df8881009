package fallback_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// slotRig is N instances behind a round-robin load balancer that skips a
// slot whose instance is down (restarting), with what each slot admitted
// in degraded mode.
type slotRig struct {
	t        *testing.T
	backend  string
	url, dir string
	slots    []atomic.Pointer[fallback.Limiter]
	inflight []atomic.Int64 // decisions under way per slot
	local    []atomic.Int64 // units admitted locally (Result.Degraded) per slot, since the slot's instance started
}

func newSlotRig(t *testing.T, backend, url string, n int) *slotRig {
	r := &slotRig{t: t, backend: backend, url: url, dir: t.TempDir(),
		slots: make([]atomic.Pointer[fallback.Limiter], n), inflight: make([]atomic.Int64, n), local: make([]atomic.Int64, n)}
	for i := range n {
		r.slots[i].Store(r.start(i))
	}
	t.Cleanup(func() {
		for i := range r.slots {
			if l := r.slots[i].Load(); l != nil {
				l.Close()
			}
		}
	})
	return r
}

// start starts instance i: ID app<i+1>, its journal in the rig's state
// dir, ExpectedInstances left at its default of 1 (what membership says
// is all it knows).
func (r *slotRig) start(i int) *fallback.Limiter {
	r.t.Helper()
	l, err := fallback.New(newStore(r.t, r.backend, r.url), fallback.Options{
		ID:        fmt.Sprintf("app%d", i+1),
		Heartbeat: 200 * time.Millisecond,
		Breaker:   fallback.BreakerOptions{CallTimeout: callTimeout, ProbeInterval: 200 * time.Millisecond, Jitter: 50 * time.Millisecond},
		StateDir:  r.dir,
		Logger:    testLogger(),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	return l
}

// restart takes instance i out of the rotation, stops it (Close, the
// SIGTERM path, or Crash, as SIGKILL) and starts it again on the same state
// dir and ID. It returns the new instance and the units the old one had
// admitted locally.
func (r *slotRig) restart(i int, crash bool) (*fallback.Limiter, int64) {
	r.t.Helper()
	old := r.slots[i].Swap(nil)
	for r.inflight[i].Load() != 0 { // the balancer has stopped sending to it
		time.Sleep(time.Millisecond)
	}
	admitted := r.local[i].Swap(0)
	if crash {
		old.Crash()
	} else if err := old.Close(); err != nil {
		r.t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // down for a moment
	l := r.start(i)
	r.slots[i].Store(l)
	return l, admitted
}

// drive sends requests for key round-robin over the live slots from
// workers goroutines, pausing pause between requests, until ctx ends.
func (r *slotRig) drive(ctx context.Context, p core.Policy, key string, workers int, pause time.Duration, ld *load) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				var l *fallback.Limiter
				var i int
				for range len(r.slots) {
					i = int(next.Add(1) % int64(len(r.slots)))
					r.inflight[i].Add(1)
					if l = r.slots[i].Load(); l != nil {
						break
					}
					r.inflight[i].Add(-1)
				}
				if l == nil {
					continue
				}
				start := time.Now()
				res, err := l.Allow(context.Background(), p, key)
				ld.observe(time.Since(start))
				switch {
				case err != nil:
					ld.errors.Add(1)
				case res.Allowed:
					ld.admitted.Add(1)
					if res.Degraded {
						r.local[i].Add(1)
					}
				default:
					ld.denied.Add(1)
				}
				r.inflight[i].Add(-1)
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
}

// waitInstances waits until every instance counts n live instances.
func (r *slotRig) waitInstances(n int64) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := range r.slots {
		for r.slots[i].Load().Status().Instances != n {
			if time.Now().After(deadline) {
				r.t.Fatalf("instance %d counts %d live instances, want %d", i, r.slots[i].Load().Status().Instances, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitRecovered waits until every instance is closed with an empty log.
func (r *slotRig) waitRecovered() {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := range r.slots {
		for st := r.slots[i].Load().Status(); st.Breaker != "closed" || st.PendingLog > 0; st = r.slots[i].Load().Status() {
			if time.Now().After(deadline) {
				r.t.Fatalf("instance %d not recovered: %+v", i, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestRestartMidOutage: Redis is killed under load above the limit (4
// instances, round robin) and, mid-outage, one instance is restarted with
// the same state dir and ID: stopped with Close (SIGTERM) or abandoned
// without it (SIGKILL). It comes back with the instance count (4, not its
// ExpectedInstances of 1), its outage log and each key's lease, so the
// instances together admit at most 1.05 of the policy's bound over the
// whole run and at least 0.9 of what one exact limiter admits from the
// start (the bound, for the token bucket and the sliding window here), no
// caller sees an error, and after Redis returns every instance reconciles
// (breakers closed, logs empty). Without the journal a
// restarted instance divides by 1 and starts a fresh lease: 1.16 of the
// bound was measured for the token bucket of 20 + 5/s.
func TestRestartMidOutage(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 20, 5)
	sw, _ := slidingwindow.Policy("sw", 20, time.Second)
	sc, _ := slidingcounter.Policy("sc", 20, time.Second)
	for _, backend := range []string{"goredis", "rueidis"} {
		for _, p := range []core.Policy{tb, sw, sc} {
			for _, crash := range []bool{false, true} {
				how := map[bool]string{false: "sigterm", true: "sigkill"}[crash]
				t.Run(fmt.Sprintf("%s/%s/%s", backend, p.Algorithm().Name(), how), func(t *testing.T) {
					t.Parallel()
					testRestartMidOutage(t, backend, p, crash)
				})
			}
		}
	}
}

func testRestartMidOutage(t *testing.T, backend string, p core.Policy, crash bool) {
	srv := redistest.Start(t, redistest.WithAOF())
	rig := newSlotRig(t, backend, srv.URL(), 4)
	rig.waitInstances(4)

	const normal, before, after, recovered = 1500 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), normal+before+after+recovered)
	defer cancel()
	var (
		restarted *fallback.Limiter
		oldLocal  int64
		status    fallback.Status
		chaos     = make(chan struct{})
	)
	go func() {
		defer close(chaos)
		time.Sleep(normal)
		srv.Kill()
		time.Sleep(before)
		restarted, oldLocal = rig.restart(1, crash)
		status = restarted.Status()
		time.Sleep(after)
		srv.Restart(t)
	}()
	var ld load
	start := time.Now()
	rig.drive(ctx, p, "client-1", 4, 2*time.Millisecond, &ld)
	took := time.Since(start)
	<-chaos
	b := bound(p, took)
	ratio := float64(ld.admitted.Load()) / b
	ideal, _ := p.Algorithm().(driver.Quotaer).Bound(p, took)
	floor := float64(ld.admitted.Load()) / ideal
	restored := fallback.RestoredFromJournal(restarted)
	how := map[bool]string{false: "SIGTERM (Close)", true: "SIGKILL (no Close)"}[crash]
	t.Logf("%s %s, %s mid-outage: admitted %d denied %d errors %d in %v: bound %.0f, ratio %.3f, %.3f of the ideal %.0f; the restarted instance counted %d instances (%s), restored %d of the %d units it had granted locally",
		backend, p.Algorithm().Name(), how, ld.admitted.Load(), ld.denied.Load(), ld.errors.Load(), took.Round(time.Millisecond), b, ratio, floor, ideal,
		status.Instances, status.Breaker, restored.Units, oldLocal)
	fault := "kill -9 Redis for 3 s, one instance restarted mid-outage (" + how + ")"
	if p.Algorithm().Name() == tokenbucket.Name {
		fault += ", bucket 20 + 5/s"
	}
	record(fault, backend, p, &ld, b)
	if ld.errors.Load() != 0 {
		t.Errorf("%d errors reached callers", ld.errors.Load())
	}
	if status.Instances != 4 || status.Breaker != "open" {
		t.Errorf("restarted instance: %+v, want open with the 4 instances it knew", status)
	}
	if lost := oldLocal - restored.Units; lost < 0 || !crash && lost != 0 || crash && lost > 2 {
		t.Errorf("restored %d units of the %d granted locally before the restart", restored.Units, oldLocal)
	}
	if ratio > 1.05 || floor < 0.9 {
		t.Errorf("admitted/bound = %.3f, want at most 1.05; admitted/ideal = %.3f, want at least 0.9", ratio, floor)
	}
	rig.waitRecovered()
}

// TestRestartKeepsInstanceCount: an instance restarted while Redis is down,
// after Close or a crash, counts the live instances it last knew (4), not
// its ExpectedInstances (1).
func TestRestartKeepsInstanceCount(t *testing.T) {
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			rig := newSlotRig(t, backend, srv.URL(), 4)
			rig.waitInstances(4)
			srv.Kill()
			time.Sleep(200 * time.Millisecond) // at least one flush of the journal
			for i, crash := range []bool{false, true} {
				l, _ := rig.restart(i, crash)
				if st := l.Status(); st.Instances != 4 || st.Breaker != "open" {
					t.Errorf("instance restarted (crash %v) while Redis is down: %+v, want open with the 4 instances it knew", crash, st)
				}
			}
		})
	}
}

// TestCrashLosesAtMostOneFlush measures what a crash loses: an instance
// granting about 20000 units a second on 1000 keys from leases is
// abandoned without Close at a random moment, five times, and restarted on
// its state dir; the units it granted but did not restore are at most one
// StateFlush (100 ms) of its grants.
func TestCrashLosesAtMostOneFlush(t *testing.T) {
	p, _ := tokenbucket.Policy("tb", 1_000_000, 1_000) // every request admitted
	dir := t.TempDir()
	const flush = 100 * time.Millisecond
	open := func() *fallback.Limiter {
		l, err := fallback.New(downStore{}, fallback.Options{
			ID: "crash", ExpectedInstances: 4, StateDir: dir,
			Breaker: fallback.BreakerOptions{Start: fallback.Open},
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	rng := rand.New(rand.NewPCG(5, 6))
	l := open()
	var worst time.Duration
	var total, lostTotal int64
	for round := range 5 {
		before := fallback.RestoredFromJournal(l).Units
		run := 300*time.Millisecond + time.Duration(rng.IntN(200))*time.Millisecond
		var granted int64
		start := time.Now()
		for i := 0; time.Since(start) < run; i++ {
			r, err := l.Allow(context.Background(), p, fmt.Sprint("k", i%1000))
			if err != nil || !r.Allowed {
				t.Fatalf("%+v %v", r, err)
			}
			granted++
			if i%20 == 19 {
				time.Sleep(time.Millisecond) // about 20000 a second
			}
		}
		elapsed := time.Since(start)
		l.Crash()
		l = open()
		restored := fallback.RestoredFromJournal(l).Units - before
		lost := granted - restored
		rate := float64(granted) / elapsed.Seconds()
		lostTime := time.Duration(float64(lost) / rate * float64(time.Second))
		worst = max(worst, lostTime)
		total += granted
		lostTotal += lost
		t.Logf("round %d: granted %d in %v (%.0f/s), restored %d, lost %d = %v of grants", round, granted, elapsed.Round(time.Millisecond), rate, restored, lost, lostTime.Round(time.Millisecond))
		if lost < 0 || lostTime > flush+20*time.Millisecond {
			t.Errorf("round %d: lost %d units (%v of grants), want at most one StateFlush (%v)", round, lost, lostTime, flush)
		}
	}
	l.Close()
	note("Crash (SIGKILL) of an instance with a state dir", fmt.Sprintf(
		"5 crashes at random moments while granting about 20000 units a second from leases: lost at most %v of grants (StateFlush %v); %d of %d units lost in all",
		worst.Round(time.Millisecond), flush, lostTotal, total))
}

// BenchmarkLocalDecisionStateDir is BenchmarkLocalDecision with a state
// dir: the journal's cost on the degraded path (its flusher running).
func BenchmarkLocalDecisionStateDir(b *testing.B) {
	p, _ := tokenbucket.Policy("bench", 1_000_000_000, 1_000_000) // every decision admits
	benchLocal(b, p, b.TempDir())
}

// TestStateDirIDs: without an ID, instances sharing a state dir each claim
// a slot and its stored ID; one that stops and starts again gets the same
// ID back (its journal with it), and two live instances never share an ID.
// With an ID, a second live instance on the same dir is refused.
func TestStateDirIDs(t *testing.T) {
	dir := t.TempDir()
	open := func(id string) (*fallback.Limiter, error) {
		return fallback.New(downStore{}, fallback.Options{ID: id, StateDir: dir, Logger: testLogger()})
	}
	a, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	b, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	idA, idB := a.Status().ID, b.Status().ID
	if idA == idB || idA == "" {
		t.Fatalf("two live instances got IDs %q and %q", idA, idB)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Status().ID; got != idA {
		t.Fatalf("restarted instance got ID %q, want its old %q", got, idA)
	}
	again.Crash() // a SIGKILL releases the slot too
	again2, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	if got := again2.Status().ID; got != idA {
		t.Fatalf("after a crash the instance got ID %q, want %q", got, idA)
	}
	defer again2.Close()
	defer b.Close()
	x, err := open("fixed")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	// Instances with a dir each (all claim slot 1) get IDs of their own.
	other, err := fallback.New(downStore{}, fallback.Options{StateDir: t.TempDir(), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if got := other.Status().ID; got == idA || got == idB {
		t.Fatalf("an instance on another dir got ID %q, as one on the first (%q, %q)", got, idA, idB)
	}
	if _, err := open("fixed"); err == nil || !strings.Contains(err.Error(), "in use by another live instance") {
		t.Fatalf("a second live instance with ID fixed on one dir: %v, want it refused", err)
	}
}

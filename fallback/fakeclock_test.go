package fallback_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// fakeClock is a clock that moves only when the test advances it; After
// registers a timer that fires when the clock passes its time.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeTimer
}

type fakeTimer struct {
	at time.Time
	d  time.Duration
	ch chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeTimer{at: c.now.Add(d), d: d, ch: ch})
	return ch
}

// Advance moves the clock by d and fires the timers it passes.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
			continue
		}
		kept = append(kept, w)
	}
	c.waiters = kept
}

// pending reports whether a timer of duration d is waiting.
func (c *fakeClock) pending(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waiters {
		if w.d == d {
			return true
		}
	}
	return false
}

// timers is the number of timers waiting whose duration d satisfies of.
func (c *fakeClock) timers(of func(d time.Duration) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, w := range c.waiters {
		if of(w.d) {
			n++
		}
	}
	return n
}

// until yields until cond holds; it fails t if that takes more than 10 s
// of real time (a hang, not a timing assertion).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	limit := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(limit) {
			t.Fatalf("never: %s", what)
		}
		runtime.Gosched()
	}
}

// TestRecoveryStepsWithFakeClock steps an outage and its recovery with an
// injected clock, no sleeps: Redis refuses (OOM) and the breaker opens;
// healed, nothing happens until the clock passes the probe interval; the
// probe's write succeeds, the log is replayed, and the breaker waits at the
// recovery barrier — still deciding locally — until the clock passes it;
// then it closes and Redis counts every grant once. It counts two
// instances (ExpectedInstances), and the other never comes back, so the
// barrier is not brought forward.
func TestRecoveryStepsWithFakeClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := &failing{Store: newStore(t, "goredis", srv.URL())}
	clk := &fakeClock{now: time.Now()}
	const probe, timeout = time.Second, 300 * time.Millisecond
	l, err := fallback.New(store, fallback.Options{
		ID: "fake", Heartbeat: time.Hour, Logger: testLogger(), Clock: clk.Now, After: clk.After,
		ExpectedInstances: 2,
		Breaker:           fallback.BreakerOptions{CallTimeout: timeout, ProbeInterval: probe},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, _ := tokenbucket.Policy("tb", 10, 0.001)
	ctx := context.Background()
	for range 4 {
		if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Allowed || r.Degraded {
			t.Fatalf("healthy: %+v %v", r, err)
		}
	}
	store.set(&core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed")})
	admitted := 0
	for range 8 {
		r, err := l.Allow(ctx, p, "k")
		if err != nil || !r.Degraded {
			t.Fatalf("in the fault: %+v %v", r, err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 3 || l.Breaker().State() != fallback.Open {
		t.Fatalf("in the fault: %d admitted (want half the 6 left), breaker %v", admitted, l.Breaker().State())
	}
	store.heal()
	until(t, "the probe loop waits a probe interval", func() bool { return clk.pending(probe) })
	if s := l.Breaker().State(); s != fallback.Open {
		t.Fatalf("healed but before the probe interval: %v, want open", s)
	}
	clk.Advance(probe)
	// The barrier is two probe intervals and two call deadlines ahead of
	// the first instance to recover: this one.
	barrier := 2*probe + 2*timeout
	until(t, "the recovery waits at the barrier", func() bool {
		return l.Breaker().State() == fallback.Reconciling && l.Status().PendingLog == 0 && clk.pending(fallback.BarrierPoll)
	})
	if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Degraded || r.Allowed {
		t.Fatalf("at the barrier: %+v %v, want a local denial (the lease is spent)", r, err)
	}
	// The instance reads the barrier every BarrierPoll: the other never
	// arrives, so it stays at its time.
	for range int(barrier/fallback.BarrierPoll) - 1 {
		until(t, "the next read of the barrier", func() bool { return clk.pending(fallback.BarrierPoll) })
		clk.Advance(fallback.BarrierPoll)
	}
	until(t, "the last read of the barrier", func() bool { return clk.pending(fallback.BarrierPoll) })
	if s := l.Breaker().State(); s != fallback.Reconciling {
		t.Fatalf("%v before the barrier: %v, want reconciling", fallback.BarrierPoll, s)
	}
	clk.Advance(fallback.BarrierPoll)
	until(t, "the breaker closes at the barrier", func() bool { return l.Breaker().State() == fallback.Closed })
	r, err := l.Allow(ctx, p, "k")
	if err != nil || r.Degraded || !r.Allowed || r.Remaining != 2 {
		t.Fatalf("after recovery: %+v %v, want a Redis admission with 2 left (4 + 3 + 1 of 10)", r, err)
	}
}

// TestBarrierComesForward steps two instances through one outage with an
// injected clock: when both counted two instances before it, the second to
// arrive at the recovery barrier (after its replay) brings it forward and
// both close within a read of it, not two probe intervals and two call
// deadlines later; when one started during the outage (it knew no count),
// both wait for the barrier's time. Either way Redis counts every grant
// once.
func TestBarrierComesForward(t *testing.T) {
	t.Parallel()
	const probe, timeout = time.Second, 300 * time.Millisecond
	barrier := 2*probe + 2*timeout
	for _, tc := range []struct {
		name      string
		lateStart bool // the second instance starts during the outage, knowing no count
	}{{"both counted", false}, {"one started in the outage", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			store := &failing{Store: newStore(t, "goredis", srv.URL())}
			clk := &fakeClock{now: time.Now()}
			start := func(id string, expected int) *fallback.Limiter {
				l, err := fallback.New(store, fallback.Options{
					ID: id, Heartbeat: time.Hour, Logger: testLogger(), Clock: clk.Now, After: clk.After,
					ExpectedInstances: expected,
					Breaker:           fallback.BreakerOptions{CallTimeout: timeout, ProbeInterval: probe},
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				return l
			}
			p, _ := tokenbucket.Policy("tb", 20, 0.001)
			ctx := context.Background()
			a := start("a", 2)
			var b *fallback.Limiter
			if !tc.lateStart {
				b = start("b", 2)
			}
			oom := &core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed")}
			store.set(oom)
			if tc.lateStart {
				b = start("b", 0) // counts only itself, and knows it does not know
			}
			admitted := 0
			for _, l := range []*fallback.Limiter{a, b} {
				for range 6 {
					if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Degraded {
						t.Fatalf("in the fault: %+v %v", r, err)
					} else if r.Allowed {
						admitted++
					}
				}
				if s := l.Breaker().State(); s != fallback.Open {
					t.Fatalf("in the fault: breaker %v, want open", s)
				}
			}
			// Each lease holds at least 10 of the 20: all 12 admitted.
			if admitted != 12 {
				t.Fatalf("in the fault: %d admitted of 12 asked, want 12 (each lease holds 10 or more)", admitted)
			}
			store.heal()
			until(t, "both probe loops wait a probe interval", func() bool { return clk.timers(func(d time.Duration) bool { return d == probe }) >= 2 })
			clk.Advance(probe)
			closed := func() bool {
				return a.Breaker().State() == fallback.Closed && b.Breaker().State() == fallback.Closed
			}
			// Each instance still reconciling, once replayed, waits on one
			// timer of at most BarrierPoll: the next read of the barrier.
			settled := func() bool {
				want := 0
				for _, l := range []*fallback.Limiter{a, b} {
					switch l.Breaker().State() {
					case fallback.Reconciling:
						if l.Status().PendingLog > 0 {
							return false
						}
						want++
					case fallback.Open:
						return false
					}
				}
				return clk.timers(func(d time.Duration) bool { return d <= fallback.BarrierPoll }) >= want
			}
			var waited time.Duration
			for !closed() && waited < barrier+time.Second {
				until(t, "every instance at the barrier waits for its next read", settled)
				if closed() {
					break
				}
				clk.Advance(fallback.BarrierPoll)
				waited += fallback.BarrierPoll
			}
			if !closed() {
				until(t, "both close", closed)
			}
			if !tc.lateStart && waited > 4*fallback.BarrierPoll {
				t.Fatalf("both closed %v after the probe, want within a few reads of the barrier (%v), not its %v", waited, fallback.BarrierPoll, barrier)
			}
			if tc.lateStart && waited < barrier {
				t.Fatalf("both closed %v after the probe, want the barrier's %v: one knew no count", waited, barrier)
			}
			t.Logf("closed %v after the probe (barrier %v)", waited, barrier)
			// Every grant is in Redis once.
			r, err := a.Allow(ctx, p, "k")
			if err != nil || r.Degraded || !r.Allowed || r.Remaining != int64(20-admitted-1) {
				t.Fatalf("after recovery: %+v %v, want a Redis admission with %d left (%d granted in the outage)", r, err, 20-admitted-1, admitted)
			}
		})
	}
}

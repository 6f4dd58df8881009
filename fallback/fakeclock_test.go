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
// then it closes and Redis counts every grant once.
func TestRecoveryStepsWithFakeClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := &failing{Store: newStore(t, "goredis", srv.URL())}
	clk := &fakeClock{now: time.Now()}
	const probe, timeout = time.Second, 300 * time.Millisecond
	l, err := fallback.New(store, fallback.Options{
		ID: "fake", Heartbeat: time.Hour, Logger: testLogger(), Clock: clk.Now, After: clk.After,
		Breaker: fallback.BreakerOptions{CallTimeout: timeout, ProbeInterval: probe},
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
	if admitted != 6 || l.Breaker().State() != fallback.Open {
		t.Fatalf("in the fault: %d admitted (want the 6 left), breaker %v", admitted, l.Breaker().State())
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
		return l.Breaker().State() == fallback.Reconciling && l.Status().PendingLog == 0 && clk.pending(barrier)
	})
	if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Degraded || r.Allowed {
		t.Fatalf("at the barrier: %+v %v, want a local denial (the lease is spent)", r, err)
	}
	clk.Advance(barrier - time.Millisecond)
	if s := l.Breaker().State(); s != fallback.Reconciling {
		t.Fatalf("a millisecond before the barrier: %v, want reconciling", s)
	}
	clk.Advance(time.Millisecond)
	until(t, "the breaker closes at the barrier", func() bool { return l.Breaker().State() == fallback.Closed })
	r, err := l.Allow(ctx, p, "k")
	if err != nil || r.Degraded || r.Allowed || r.Remaining != 0 {
		t.Fatalf("after recovery: %+v %v, want a Redis denial with 0 left (4 + 6 of 10)", r, err)
	}
}

package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// gate is a store that can be cut: while down every call fails as a lost
// connection does. count, when set, sees every reply.
type gate struct {
	driver.Store
	down  atomic.Bool
	count func(sc *driver.Script, keys []string, reply []int64)
	// refused, if set, sees each call the gate refused while down.
	refused func(sc *driver.Script, keys []string)
	// fail, if set, refuses the calls it is true for, as if down; it may
	// be set while the gate is in use.
	fail atomic.Pointer[func(sc *driver.Script) bool]
}

// fails reports whether fail refuses a call of sc.
func (g *gate) fails(sc *driver.Script) bool {
	f := g.fail.Load()
	return f != nil && (*f)(sc)
}

func (g *gate) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	if g.fails(s) {
		return nil, driver.Errorf(core.ErrStoreUnavailable, "gate: failed")
	}
	if g.down.Load() {
		if g.refused != nil {
			g.refused(s, keys)
		}
		return nil, driver.Errorf(core.ErrStoreUnavailable, "gate: cut")
	}
	r, err := g.Store.Run(ctx, s, keys, args)
	if err == nil && g.count != nil {
		g.count(s, keys, r)
	}
	return r, err
}

// pipeGate is a gate over a store that pipelines (driver.Pipeliner), which
// it passes on: AllowAll then charges in one round trip.
type pipeGate struct{ *gate }

func (g pipeGate) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	res := make([]driver.CallResult, len(calls))
	if g.down.Load() {
		for i := range res {
			res[i].Err = driver.Errorf(core.ErrStoreUnavailable, "gate: cut")
			if g.refused != nil {
				g.refused(calls[i].Script, calls[i].Keys)
			}
		}
		return res
	}
	var send []driver.Call // the calls fail lets through, sent
	var at []int
	for i, c := range calls {
		if g.fails(c.Script) {
			res[i].Err = driver.Errorf(core.ErrStoreUnavailable, "gate: failed")
			continue
		}
		send, at = append(send, c), append(at, i)
	}
	for j, r := range g.Store.(driver.Pipeliner).RunMany(ctx, send) {
		res[at[j]] = r
	}
	for i, r := range res {
		if r.Err == nil && g.count != nil {
			g.count(calls[i].Script, calls[i].Keys, r.Reply)
		}
	}
	return res
}

// gated is g as a store: pipelining or not.
func gated(g *gate, pipelined bool) driver.Store {
	if pipelined {
		return pipeGate{g}
	}
	return g
}

func newGated(t *testing.T, backend string, srv *redistest.Server, down bool) (*fallback.Limiter, *gate) {
	return newGatedPipe(t, backend, srv, down, false)
}

func newGatedPipe(t *testing.T, backend string, srv *redistest.Server, down, pipelined bool) (*fallback.Limiter, *gate) {
	t.Helper()
	g := &gate{Store: newStore(t, backend, srv.URL())}
	g.down.Store(down)
	l, err := fallback.New(gated(g, pipelined), fallback.Options{
		ID:      "ops-" + backend,
		Breaker: fallback.BreakerOptions{CallTimeout: callTimeout, ProbeInterval: 20 * time.Millisecond},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, g
}

// TestOps: Peek, Reset and AllowAll with exact values through Redis (both
// clients) and during an outage, where one instance's share is the whole
// quota and the local path applies the same rules.
func TestOps(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, backend := range []string{"goredis", "rueidis"} {
		for _, pipelined := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/redis/pipelined=%v", backend, pipelined), func(t *testing.T) {
				l, _ := newGatedPipe(t, backend, srv, false, pipelined)
				storetest.RunOps(t, l)
				if st := l.Status(); st.Breaker != "closed" || st.PendingLog != 0 {
					t.Fatalf("status after the ops: %+v", st)
				}
			})
		}
		t.Run(backend+"/outage", func(t *testing.T) {
			l, _ := newGated(t, backend, srv, true)
			storetest.RunOps(t, l)
			if st := l.Status(); st.Breaker != "open" {
				t.Fatalf("breaker %s, want open", st.Breaker)
			}
		})
	}
}

// TestResetDuringOutage: a Reset while Redis is cut gives the instance a
// full share at once, drops the grants it logged before the reset, and is
// applied in Redis when it returns, once: after the recovery Redis holds
// exactly the grants made after the reset.
func TestResetDuringOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			l, g := newGated(t, backend, srv, false)
			ctx := context.Background()
			tb := must(tokenbucket.Policy("rtb"+backend, 5, 5.0/3600))
			sw := must(slidingwindow.Policy("rsw"+backend, 5, time.Hour))
			for _, p := range []core.Policy{tb, sw} {
				for range 5 {
					if r, err := l.Allow(ctx, p, "cust"); err != nil || !r.Allowed || r.Degraded {
						t.Fatalf("%s through Redis: %+v %v", p.Name(), r, err)
					}
				}
			}
			g.down.Store(true)
			for _, p := range []core.Policy{tb, sw} {
				// The lease starts from the known state: empty.
				if r, err := l.Allow(ctx, p, "cust"); err != nil || r.Allowed || !r.Degraded {
					t.Fatalf("%s in the outage before Reset: %+v %v, want a local denial", p.Name(), r, err)
				}
				if err := l.Reset(ctx, p, "cust"); err != nil {
					t.Fatal(err)
				}
				for i := range 2 {
					if r, err := l.Allow(ctx, p, "cust"); err != nil || !r.Allowed || !r.Degraded || r.Remaining != int64(4-i) {
						t.Fatalf("%s after Reset, request %d: %+v %v, want a local admission with %d left", p.Name(), i, r, err, 4-i)
					}
				}
			}
			if st := l.Status(); st.Breaker != "open" || st.PendingLog < 2 || st.PendingLog > 4 {
				t.Fatalf("status in the outage: %+v, want open with the 4 grants after the resets logged (2 to 4 entries)", st)
			}
			g.down.Store(false)
			until(t, "the breaker to close", func() bool { return l.Status().Breaker == "closed" && l.Status().PendingLog == 0 })
			for _, p := range []core.Policy{tb, sw} {
				// Redis: reset, then the 2 grants made after it.
				if r, err := l.Peek(ctx, p, "cust", 3); err != nil || !r.Allowed || r.Remaining != 0 || r.Degraded {
					t.Fatalf("%s after the recovery, peek of 3: %+v %v, want admitted with 0 left", p.Name(), r, err)
				}
				if r, err := l.Peek(ctx, p, "cust", 4); err != nil || r.Allowed {
					t.Fatalf("%s after the recovery, peek of 4: %+v %v, want denied", p.Name(), r, err)
				}
			}
		})
	}
}

// TestAllowAllOutageMidway: a request of an AllowAll whose store call
// fails goes to the local path, and the rule holds there: nothing spent
// by a denied call, the share never exceeded.
func TestAllowAllLocal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, _ := newGated(t, "goredis", srv, true)
	ctx := context.Background()
	sec := must(tokenbucket.Policy("lsec", 3, 3.0/3600))
	day := must(tokenbucket.Policy("lday", 5, 5.0/3600))
	admitted, denied := 0, 0
	for range 20 {
		rs, err := l.AllowAll(ctx, core.Request{Policy: sec, Key: "c"}, core.Request{Policy: day, Key: "c"})
		if err != nil {
			t.Fatal(err)
		}
		if core.AllAllowed(rs) {
			admitted++
		} else {
			denied++
		}
	}
	if admitted != 3 || denied != 17 {
		t.Fatalf("admitted %d, denied %d; want 3 and 17", admitted, denied)
	}
	// day was spent only by the 3 admitted.
	if r, err := l.Peek(ctx, day, "c", 2); err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("day after the calls: %+v %v, want 2 left", r, err)
	}
	if _, err := l.AllowAll(ctx); !errors.Is(err, core.ErrInvalidPolicy) {
		t.Fatalf("AllowAll of nothing: %v", err)
	}
	if _, err := l.AllowAll(ctx, core.Request{Policy: sec, Key: ""}); !errors.Is(err, core.ErrEmptyKey) {
		t.Fatalf("AllowAll with an empty key: %v", err)
	}
	if _, err := l.AllowAll(ctx, core.Request{Policy: sec, Key: "c", Cost: 4}); !errors.Is(err, core.ErrCostExceedsLimit) {
		t.Fatalf("AllowAll above capacity: %v", err)
	}
}

// TestLifecycle: a decision before Start is ErrNotStarted (without its
// probe an opened breaker would never close again), after Close
// ErrClosed; Start twice or after Close is an error, Close twice is not.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, err := fallback.New(newStore(t, "goredis", srv.URL()), fallback.Options{ID: "life", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := must(tokenbucket.Policy("life", 3, 1))
	calls := func(want error) {
		t.Helper()
		if _, err := l.Allow(ctx, p, "k"); !errors.Is(err, want) {
			t.Fatalf("Allow: %v, want %v", err, want)
		}
		if _, err := l.Peek(ctx, p, "k", 1); !errors.Is(err, want) {
			t.Fatalf("Peek: %v, want %v", err, want)
		}
		if err := l.Reset(ctx, p, "k"); !errors.Is(err, want) {
			t.Fatalf("Reset: %v, want %v", err, want)
		}
		if _, err := l.AllowAll(ctx, core.Request{Policy: p, Key: "k"}); !errors.Is(err, want) {
			t.Fatalf("AllowAll: %v, want %v", err, want)
		}
	}
	calls(fallback.ErrNotStarted)
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Allowed || r.Remaining != 2 {
		t.Fatalf("started: %+v %v", r, err)
	}
	if err := l.Start(ctx); err == nil {
		t.Fatal("second Start: no error")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	calls(fallback.ErrClosed)
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Start(ctx); err == nil {
		t.Fatal("Start after Close: no error")
	}
}

// TestPeekSeedsLease: a Peek through Redis is a Redis reply like a
// decision's, so it becomes the key's known state. One instance of two
// spends a quota of 10 through Redis; the other only peeks the key (denied)
// before Redis is cut, and its lease then starts from what the peek saw:
// 0 of 10 admitted, where a lease from nothing known gives its half, 5.
// (AllowAll peeks the requests after one that denies: their known states
// stay as fresh as the first's.)
func TestPeekSeedsLease(t *testing.T) {
	const limit = 10
	tb, sw, sc := spentPolicies("pk", limit)
	for _, tc := range []struct {
		backend string
		p       core.Policy
	}{{"goredis", tb}, {"rueidis", sw}, {"goredis", sc}} {
		t.Run(tc.backend+"/"+tc.p.Algorithm().Name(), func(t *testing.T) {
			t.Parallel()
			waitWindow(t, tc.p)
			srv := redistest.Start(t)
			in := startInstances(t, tc.backend, srv.URL(), 2, "")
			time.Sleep(300 * time.Millisecond) // both heartbeats in: 2 instances
			spender, peeker := in.lims[0], in.lims[1]
			if a := spend(t, spender, tc.p, "client-1", limit, core.ModeRedis); a != limit {
				t.Fatalf("%d of %d admitted through Redis, want all", a, limit)
			}
			if r, err := peeker.Peek(context.Background(), tc.p, "client-1", 1); err != nil || r.Allowed || r.Mode != core.ModeRedis {
				t.Fatalf("peek: %+v %v, want denied through Redis", r, err)
			}
			killOpen(t, srv, peeker, tc.p)
			if admitted := spend(t, peeker, tc.p, "client-1", limit, core.ModeLocal); admitted != 0 {
				t.Errorf("%d of a spent quota of %d admitted from the lease after a peek saw it spent, want 0", admitted, limit)
			}
		})
	}
}

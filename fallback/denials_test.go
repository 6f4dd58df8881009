package fallback_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// counting counts the calls that reach the store.
type counting struct {
	driver.Store
	calls atomic.Int64
}

func (c *counting) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	c.calls.Add(1)
	return c.Store.Run(ctx, s, keys, args)
}

func newCounted(t testing.TB, srv *redistest.Server, clock func() time.Time, noMemory bool) (*fallback.Limiter, *counting) {
	store := &counting{Store: newStore(t.(*testing.T), "goredis", srv.URL())}
	l, err := fallback.New(store, fallback.Options{
		ID: "memo", Clock: clock, NoDenialMemory: noMemory,
		Breaker: fallback.BreakerOptions{CallTimeout: callTimeout},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	l.MarkStarted() // the tests step the clock themselves: no background work
	return l, store
}

// TestDenialMemory: a denied key is answered from memory, without a Redis
// call, for the same or a higher cost until the retry time Redis gave;
// a lower cost, or any request after that time, goes to Redis.
func TestDenialMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	l, store := newCounted(t, srv, func() time.Time { return time.Unix(0, now.Load()) }, false)
	p, _ := tokenbucket.Policy("tb", 4, 1)
	ctx := context.Background()
	if r, err := l.AllowN(ctx, p, "k", 3); err != nil || !r.Allowed {
		t.Fatalf("first: %+v %v", r, err)
	}
	r, err := l.AllowN(ctx, p, "k", 2)
	if err != nil || r.Allowed || r.RetryAfter <= 0 || r.RetryAfter > time.Second {
		t.Fatalf("denial: %+v %v", r, err)
	}
	base := store.calls.Load()
	for range 100 {
		for _, cost := range []int64{2, 3, 4} {
			if r, err := l.AllowN(ctx, p, "k", cost); err != nil || r.Allowed || r.Mode != core.ModeRedis || r.Remaining != 1 {
				t.Fatalf("remembered denial of cost %d: %+v %v", cost, r, err)
			}
		}
	}
	if got := store.calls.Load() - base; got != 0 {
		t.Fatalf("%d Redis calls for 300 repeats of a denial, want 0", got)
	}
	// A lower cost may fit: Redis decides (one token is left).
	if r, err := l.AllowN(ctx, p, "k", 1); err != nil || !r.Allowed || store.calls.Load()-base != 1 {
		t.Fatalf("cost 1: %+v %v, calls %d", r, err, store.calls.Load()-base)
	}
	// After the retry time the memory is silent again.
	now.Add(int64(2 * time.Second))
	before := store.calls.Load()
	l.AllowN(ctx, p, "k", 2)
	if store.calls.Load() != before+1 {
		t.Fatal("a request after the retry time was answered from memory")
	}
}

// TestDenialMemoryLatestEnd: the memory keeps answering a key whose
// denial ends last after another key's, remembered later, has ended; once
// every denial has ended each request goes to Redis again.
func TestDenialMemoryLatestEnd(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	l, store := newCounted(t, srv, func() time.Time { return time.Unix(0, now.Load()) }, false)
	slow := must(tokenbucket.Policy("slow", 4, 0.5)) // an empty bucket refills in 8 s
	fast := must(tokenbucket.Policy("fast", 4, 4))   // in 1 s
	ctx := context.Background()
	for _, p := range []core.Policy{slow, fast} {
		if r, err := l.AllowN(ctx, p, "k", 4); err != nil || !r.Allowed {
			t.Fatalf("%s: first: %+v %v", p.Name(), r, err)
		}
		if r, err := l.AllowN(ctx, p, "k", 4); err != nil || r.Allowed {
			t.Fatalf("%s: denial: %+v %v", p.Name(), r, err)
		}
	}
	calls := func(p core.Policy) int64 {
		before := store.calls.Load()
		if _, err := l.AllowN(ctx, p, "k", 4); err != nil {
			t.Fatal(err)
		}
		return store.calls.Load() - before
	}
	if a, b := calls(slow), calls(fast); a != 0 || b != 0 {
		t.Fatalf("Redis calls while both denials live: slow %d, fast %d, want 0, 0", a, b)
	}
	now.Add(int64(2 * time.Second))
	if a, b := calls(slow), calls(fast); a != 0 || b != 1 {
		t.Fatalf("Redis calls 2 s on: slow %d, fast %d, want 0 (8 s denial), 1 (ended)", a, b)
	}
	now.Add(int64(10 * time.Second))
	if a, b := calls(slow), calls(fast); a != 1 || b != 1 {
		t.Fatalf("Redis calls 12 s on: slow %d, fast %d, want 1, 1", a, b)
	}
}

// TestDenialMemoryAgreesWithRedis hammers a key on the real clock with and
// without the memory: the admitted counts are the same (the bound), and
// the memory saved most Redis calls. The run lasts 4.5 sliding windows:
// the window's units come back in bursts a window apart, and a run of a
// whole number of windows would end on a burst, whose units a caller
// scheduled a little late on a busy machine misses (20 against 25 in a
// run beside the full suite).
func TestDenialMemoryAgreesWithRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, p := range []core.Policy{
		must(tokenbucket.Policy("tb", 5, 20)),
		must(slidingwindow.Policy("sw", 5, 250*time.Millisecond)),
	} {
		var admitted [2]int
		var calls [2]int64
		for i, noMemory := range []bool{false, true} {
			l, store := newCounted(t, srv, time.Now, noMemory)
			key := p.Name() + "-" + map[bool]string{false: "memo", true: "plain"}[noMemory]
			deadline := time.Now().Add(1125 * time.Millisecond)
			for time.Now().Before(deadline) {
				r, err := l.Allow(context.Background(), p, key)
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed {
					admitted[i]++
				}
			}
			calls[i] = store.calls.Load()
		}
		t.Logf("%s: admitted %d with memory (%d Redis calls), %d without (%d calls)", p, admitted[0], calls[0], admitted[1], calls[1])
		if d := admitted[0] - admitted[1]; d > 2 || d < -2 {
			t.Errorf("%s: admitted %d with memory, %d without", p, admitted[0], admitted[1])
		}
		if calls[0]*5 > calls[1] {
			t.Errorf("%s: memory saved too little: %d calls vs %d", p, calls[0], calls[1])
		}
	}
}

func must(p core.Policy, err error) core.Policy {
	if err != nil {
		panic(err)
	}
	return p
}

// BenchmarkHotDeniedKey: a key hammered past its limit, answered from the
// denial memory versus asking Redis every time.
func BenchmarkHotDeniedKey(b *testing.B) {
	srv := redistest.Start(b)
	p := must(tokenbucket.Policy("hot", 1, 0.001))
	for _, noMemory := range []bool{false, true} {
		name := map[bool]string{false: "memory", true: "redis"}[noMemory]
		b.Run(name, func(b *testing.B) {
			c, err := goredis.NewClient(srv.URL(), goredis.ClientOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			l, err := fallback.New(goredis.New(c), fallback.Options{ID: "hot", NoDenialMemory: noMemory,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			l.MarkStarted()
			ctx := context.Background()
			l.Allow(ctx, p, name) // spends the only token
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r, err := l.Allow(ctx, p, name); err != nil || r.Allowed {
						b.Errorf("%+v %v", r, err)
						return
					}
				}
			})
		})
	}
}

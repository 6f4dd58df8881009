package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
)

// collapser is a store that sends a hot key's concurrent decisions
// together (pipeline.Decisions); the backends export it to their tests.
type collapser interface {
	CollapseStats() (calls, decisions int64)
}

// testCollapse: many callers on one key of a bucket that does not refill
// within the test admit exactly its capacity, through calls that carried
// several decisions each, and every decision gets its own reply; callers
// on other keys meanwhile are decided as alone.
func testCollapse(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	co, ok := s.(collapser)
	if !ok {
		t.Fatalf("%T does not report collapsed calls", s)
	}
	l, err := core.NewLimiter(s, core.Options{Prefix: "collapse:"})
	if err != nil {
		t.Fatal(err)
	}
	const capacity, workers, each = 300, 32, 40 // 1280 attempts
	p, err := tokenbucket.Policy("hot", capacity, 1.0/3600)
	if err != nil {
		t.Fatal(err)
	}
	var admitted, denied, otherAdmitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*each*2)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := l.AllowN(ctx, p, "k", 1)
				cancel()
				switch {
				case err != nil:
					errs <- err
				case r.Allowed:
					admitted.Add(1)
				default:
					denied.Add(1)
					if r.Remaining != 0 || r.RetryAfter <= 0 {
						errs <- fmt.Errorf("denied with %d remaining, retry after %v", r.Remaining, r.RetryAfter)
					}
				}
				if i%10 == 0 {
					// A key of its own: never waits on another's call.
					r, err := l.AllowN(context.Background(), p, fmt.Sprintf("own%d:%d", w, i), capacity)
					if err != nil {
						errs <- err
					} else if r.Allowed {
						otherAdmitted.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := admitted.Load(); got != capacity {
		t.Errorf("admitted %d of %d attempts on one key, want exactly the capacity %d", got, workers*each, capacity)
	}
	if got := denied.Load(); got != workers*each-capacity {
		t.Errorf("denied %d, want %d", got, workers*each-capacity)
	}
	if got, want := otherAdmitted.Load(), int64(workers*each/10); got != want {
		t.Errorf("own keys admitted %d full-capacity requests, want %d", got, want)
	}
	calls, decisions := co.CollapseStats()
	t.Logf("%d calls carried %d decisions", calls, decisions)
	if calls == 0 || decisions < 2*calls {
		t.Errorf("%d calls of several decisions carried %d: the hot key's callers did not share calls", calls, decisions)
	}
	// The bucket holds what it would after capacity single decisions:
	// empty, its E about a full bucket's refill ahead of now.
	r, err := l.Peek(context.Background(), p, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Remaining != 0 {
		t.Errorf("bucket holds %d tokens after %d admitted, want 0", r.Remaining, capacity)
	}
}

// testCollapseGiveUp: callers that give up among a hot key's callers do
// not hold up the others, which all get their replies; the bucket spends
// every admitted decision, and of the given-up ones at most those whose
// outcome was unknown (a call may be sent before its caller gives up).
// pipeline's TestDecisionsGiveUp shows that a decision given up while it
// waits is never sent.
func testCollapseGiveUp(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	l, err := core.NewLimiter(s, core.Options{Prefix: "giveup:"})
	if err != nil {
		t.Fatal(err)
	}
	const capacity = 1000
	p, err := tokenbucket.Policy("hot", capacity, 1.0/3600)
	if err != nil {
		t.Fatal(err)
	}
	var admitted, gaveUp atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 30 {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%3 == 0 {
					cancel() // some give up at once: sent alone or never
				}
				r, err := l.AllowN(ctx, p, "k", 1)
				cancel()
				switch {
				case err == nil && r.Allowed:
					admitted.Add(1)
				case errors.Is(err, context.Canceled):
					gaveUp.Add(1)
				case err != nil:
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	r, err := l.Peek(context.Background(), p, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if spent := capacity - r.Remaining; spent < admitted.Load() || spent > admitted.Load()+gaveUp.Load() {
		t.Errorf("bucket spent %d, callers were admitted %d and %d gave up", spent, admitted.Load(), gaveUp.Load())
	}
	if admitted.Load()+gaveUp.Load() != 16*30 {
		t.Errorf("admitted %d + gave up %d, want %d decisions", admitted.Load(), gaveUp.Load(), 16*30)
	}
}

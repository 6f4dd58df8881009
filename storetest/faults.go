package storetest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// runFaults runs a Redis backend's store against servers that die,
// restart, stall or were never there: every call fails with
// core.ErrStoreUnavailable within StallBound, and the store serves again
// once the server is back. The faults of Run, then those of RunMany, each
// run in parallel with their siblings.
func runFaults(t *testing.T, h RedisHarness) {
	t.Run("run", func(t *testing.T) { runServerFaults(t, h) })
	t.Run("run_many", func(t *testing.T) { runManyFaults(t, h) })
	t.Run("run_commands", func(t *testing.T) { runCommandsFaults(t, h) })
	runParallel(t, h, []redisTest{
		{"unreachable", testUnreachable},
		{"canceled", testCanceled},
	})
}

// run runs scriptInts with deadline d (none if 0) and reports how long it
// took.
func run(s driver.Store, d time.Duration) (time.Duration, error) {
	ctx := context.Background()
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	start := time.Now()
	_, err := s.Run(ctx, scriptInts, []string{"k"}, []string{"1"})
	return time.Since(start), err
}

// wantUnavailable runs n calls that must each fail with ErrStoreUnavailable
// within StallBound.
func wantUnavailable(t *testing.T, s driver.Store, what string, d time.Duration, n int) {
	t.Helper()
	for i := range n {
		took, err := run(s, d)
		if !errors.Is(err, core.ErrStoreUnavailable) {
			t.Fatalf("%s, call %d: error %v, want ErrStoreUnavailable", what, i, err)
		}
		if took > StallBound {
			t.Fatalf("%s, call %d: took %v, bound %v", what, i, took, StallBound)
		}
		t.Logf("%s, call %d: %v after %v", what, i, err, took)
	}
}

// wantOK runs one call that must succeed.
func wantOK(t *testing.T, s driver.Store, what string) {
	t.Helper()
	if _, err := run(s, 5*time.Second); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// runServerFaults injects each fault into a server of its own under a
// store with the default client options, or o.
func runServerFaults(t *testing.T, h RedisHarness) {
	for _, tc := range []struct {
		name  string
		o     StoreOptions
		fault func(t *testing.T, srv *redistest.Server, s driver.Store)
	}{
		{"killed_then_restarted", StoreOptions{}, func(t *testing.T, srv *redistest.Server, s driver.Store) {
			srv.Kill()
			wantUnavailable(t, s, "killed", 50*time.Millisecond, 3)
			srv.Restart(t)
			wantOK(t, s, "first call after restart")
		}},
		{"restarted_under_idle_connection", StoreOptions{}, func(t *testing.T, srv *redistest.Server, s driver.Store) {
			// The idle connection is dead; the client must find out
			// before a call uses it (go-redis checks idle connections
			// before use; with AlwaysPipelining, rueidis's reader
			// goroutine sees the server close each connection).
			srv.Kill()
			srv.Restart(t)
			wantOK(t, s, "first call after restart")
		}},
		{"paused_with_deadline", StoreOptions{}, func(t *testing.T, srv *redistest.Server, s driver.Store) {
			srv.Pause()
			wantUnavailable(t, s, "paused", 50*time.Millisecond, 3)
			srv.Resume()
			wantOK(t, s, "first call after resume")
		}},
		// Without a deadline only the client's own timeouts bound a call:
		// go-redis's ReadTimeout; for rueidis, the health PING that closes
		// the stalled connection, 2 × KeepAlive + ConnWriteTimeout at most.
		{"paused_without_deadline", StoreOptions{StallTimeout: 250 * time.Millisecond}, func(t *testing.T, srv *redistest.Server, s driver.Store) {
			srv.Pause()
			wantUnavailable(t, s, "paused", 0, 2)
			srv.Resume()
			wantOK(t, s, "first call after resume")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := h.NewStore(t, srv.URL(), tc.o)
			wantOK(t, s, "healthy")
			tc.fault(t, srv, s)
		})
	}
}

func testUnreachable(t *testing.T, h RedisHarness) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := h.NewStore(t, "redis://"+addr, StoreOptions{})
	wantUnavailable(t, s, "nothing listening", 50*time.Millisecond, 2)
	if err := s.Ping(context.Background()); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("Ping: %v, want ErrStoreUnavailable", err)
	}
}

func testCanceled(t *testing.T, h RedisHarness) {
	s := h.NewStore(t, redistest.Start(t).URL(), relaxed)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Run(ctx, scriptInts, nil, []string{"1"})
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled context: %v, want ErrStoreUnavailable and context.Canceled", err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

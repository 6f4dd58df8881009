package rueidis_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
)

// stallBound is the longest a call with a 50 ms deadline may take against a
// dead or black-holed Redis. It is a correctness bound on a stall, far above
// the deadline so that a loaded machine does not fail it.
const stallBound = 500 * time.Millisecond

// run runs scriptInts with deadline d (none if 0) and reports how long it
// took.
func run(s *hfrueidis.Store, d time.Duration) (time.Duration, error) {
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
// within stallBound.
func wantUnavailable(t *testing.T, s *hfrueidis.Store, what string, d time.Duration, n int) {
	t.Helper()
	for i := range n {
		took, err := run(s, d)
		if !errors.Is(err, core.ErrStoreUnavailable) {
			t.Fatalf("%s, call %d: error %v, want ErrStoreUnavailable", what, i, err)
		}
		if took > stallBound {
			t.Fatalf("%s, call %d: took %v, bound %v", what, i, took, stallBound)
		}
		t.Logf("%s, call %d: %v after %v", what, i, err, took)
	}
}

// wantOK runs one call that must succeed.
func wantOK(t *testing.T, s *hfrueidis.Store, what string) {
	t.Helper()
	if _, err := run(s, 5*time.Second); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  hfrueidis.ClientOptions
		fault func(t *testing.T, srv *redistest.Server, s *hfrueidis.Store)
	}{
		{"killed_then_restarted", hfrueidis.ClientOptions{}, func(t *testing.T, srv *redistest.Server, s *hfrueidis.Store) {
			srv.Kill()
			wantUnavailable(t, s, "killed", 50*time.Millisecond, 3)
			srv.Restart(t)
			wantOK(t, s, "first call after restart")
		}},
		{"restarted_under_idle_connection", hfrueidis.ClientOptions{}, func(t *testing.T, srv *redistest.Server, s *hfrueidis.Store) {
			// With AlwaysPipelining each connection has a reader goroutine
			// that sees the server close it, so no call uses the dead one.
			srv.Kill()
			srv.Restart(t)
			wantOK(t, s, "first call after restart")
		}},
		{"paused_with_deadline", hfrueidis.ClientOptions{}, func(t *testing.T, srv *redistest.Server, s *hfrueidis.Store) {
			srv.Pause()
			wantUnavailable(t, s, "paused", 50*time.Millisecond, 3)
			srv.Resume()
			wantOK(t, s, "first call after resume")
		}},
		// Without a deadline a pipelined call waits until the health PING
		// closes the stalled connection: 2 × KeepAlive + ConnWriteTimeout
		// at most, 250 ms here.
		{"paused_without_deadline", hfrueidis.ClientOptions{KeepAlive: 100 * time.Millisecond}, func(t *testing.T, srv *redistest.Server, s *hfrueidis.Store) {
			srv.Pause()
			wantUnavailable(t, s, "paused", 0, 2)
			srv.Resume()
			wantOK(t, s, "first call after resume")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := newStore(t, srv.URL(), tc.opts)
			wantOK(t, s, "healthy")
			tc.fault(t, srv, s)
		})
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := newStore(t, "redis://"+addr, hfrueidis.ClientOptions{})
	wantUnavailable(t, s, "nothing listening", 50*time.Millisecond, 2)
	if err := s.Ping(context.Background()); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("Ping: %v, want ErrStoreUnavailable", err)
	}
}

func TestCanceled(t *testing.T) {
	t.Parallel()
	s := newStore(t, redistest.Start(t).URL(), relaxed)
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

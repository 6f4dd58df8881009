package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/internal/redistest"
)

// TestReplyFaults: each fault makes a script write fail with its error
// prefix, on a new connection and on one opened before the fault; the undo
// restores writes; the data set is still there afterwards.
func TestReplyFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, prefix string
		opts         []redistest.Option
		inject       func(t *testing.T, s *redistest.Server) (undo func())
		hold         time.Duration // how long to keep it before the undo
	}{
		{name: "oom", prefix: "OOM", inject: func(t *testing.T, s *redistest.Server) func() { return s.OutOfMemory(t) }},
		// The replica retries its master every second: it must keep its
		// data set through that.
		{name: "readonly", prefix: "READONLY", hold: 2500 * time.Millisecond,
			inject: func(t *testing.T, s *redistest.Server) func() { return s.ReadOnlyReplica(t) }},
		{name: "noperm", prefix: "NOPERM", inject: func(t *testing.T, s *redistest.Server) func() { return s.DenyScripts(t) }},
		{name: "wrongpass", prefix: "WRONGPASS", opts: []redistest.Option{redistest.WithPassword("old secret")},
			inject: func(t *testing.T, s *redistest.Server) func() { return s.RotatePassword(t) }},
		{name: "busy", prefix: "BUSY", inject: func(t *testing.T, s *redistest.Server) func() { return s.BusyScript(t) }},
		{name: "misconf", prefix: "MISCONF", inject: func(t *testing.T, s *redistest.Server) func() { return s.FailedSave(t) }},
		{name: "loading", prefix: "LOADING", inject: func(t *testing.T, s *redistest.Server) func() {
			wait := s.SlowLoad(t, 1500*time.Millisecond)
			return func() { wait() }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, tc.opts...)
			s.Do(t, "SET", "keep", "me")
			// A client connected before the fault, as a limiter's would be.
			opt, err := redis.ParseURL(s.URL())
			if err != nil {
				t.Fatal(err)
			}
			opt.MaxRetries, opt.DisableIdentity = -1, true
			c := redis.NewClient(opt)
			defer c.Close()
			ctx := context.Background()
			if err := c.Eval(ctx, "return redis.call('SET', KEYS[1], 'v')", []string{"before"}).Err(); err != nil {
				t.Fatalf("write before the fault: %v", err)
			}

			began := time.Now()
			undo := tc.inject(t, s)
			t.Logf("%s in place after %v", tc.name, time.Since(began).Round(time.Millisecond))
			if err := s.ScriptWrite(); err == nil || !strings.HasPrefix(err.Error(), tc.prefix) {
				t.Fatalf("new connection: script write = %v, want an error starting with %s", err, tc.prefix)
			}
			// The old connection may first see its end (a killed or
			// restarted connection), then the reply.
			var last error
			for range 3 {
				last = c.Eval(ctx, "return redis.call('SET', KEYS[1], 'v')", []string{"during"}).Err()
				if last != nil && strings.HasPrefix(last.Error(), tc.prefix) {
					break
				}
			}
			if last == nil || !strings.HasPrefix(last.Error(), tc.prefix) {
				t.Errorf("old connection: script write = %v, want an error starting with %s", last, tc.prefix)
			}

			time.Sleep(tc.hold)
			lifted := time.Now()
			undo()
			t.Logf("%s lifted after %v (on for %v)", tc.name, time.Since(lifted).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
			if err := s.ScriptWrite(); err != nil {
				t.Fatalf("after the undo: script write = %v", err)
			}
			for range 3 {
				if last = c.Eval(ctx, "return redis.call('SET', KEYS[1], 'v')", []string{"after"}).Err(); last == nil {
					break
				}
			}
			if last != nil {
				t.Errorf("old client after the undo: %v", last)
			}
			if got := s.Do(t, "GET", "keep"); got != "me" {
				t.Errorf("GET keep after the fault = %q, want the data set kept", got)
			}
			if got := s.Do(t, "GET", "before"); got != "v" {
				t.Errorf("GET before after the fault = %q, want the data set kept", got)
			}
		})
	}
}

// TestSlowLoadLasts: SlowLoad's fault lasts about as long as asked, and
// leaves no filler keys behind.
func TestSlowLoadLasts(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	s.Do(t, "SET", "keep", "me")
	const d = 2 * time.Second
	began := time.Now()
	wait := s.SlowLoad(t, d)
	on := time.Now()
	last := wait()
	lasted := last.Sub(on)
	t.Logf("loading seen for %v (asked %v), restart %v, writes back %v after the last LOADING",
		lasted.Round(time.Millisecond), d, on.Sub(began).Round(time.Millisecond), time.Since(last).Round(time.Millisecond))
	if lasted < d*3/4 || lasted > 3*d {
		t.Errorf("loading lasted %v, want about %v", lasted, d)
	}
	if got := s.Do(t, "DBSIZE"); got != "2" { // keep and the probe key
		t.Errorf("DBSIZE after loading = %s, want 2", got)
	}
	if got := s.Do(t, "GET", "keep"); got != "me" {
		t.Errorf("GET keep = %q", got)
	}
}

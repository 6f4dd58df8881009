package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
)

// commandTests are the tests of RunCommands (driver.Commander): commands
// in order across its pipelines, each error mapped as Run maps it.
// runFaults holds its faults.
var commandTests = []redisTest{
	{"in_order", testRunCommandsInOrder},
	{"maps_like_run", testRunCommandsMapsLikeRun},
	{"canceled", testRunCommandsCanceled},
}

// pushes returns n commands that push 0 to n-1 onto one list.
func pushes(key string, n int) [][]string {
	cmds := make([][]string, n)
	for i := range cmds {
		cmds[i] = []string{"RPUSH", key, strconv.Itoa(i)}
	}
	return cmds
}

// testRunCommandsInOrder: commands on one key, more than one pipeline's
// worth, run in their order, each once.
func testRunCommandsInOrder(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	const n = 4500
	errs := s.RunCommands(context.Background(), pushes("{c}:list", n))
	if len(errs) != n {
		t.Fatalf("got %d errors, want %d", len(errs), n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	got := strings.Fields(strings.Trim(srv.Do(t, "LRANGE", "{c}:list", "0", "-1"), "[]"))
	if len(got) != n {
		t.Fatalf("the list has %d elements, want %d", len(got), n)
	}
	for i, v := range got {
		if v != strconv.Itoa(i) {
			t.Fatalf("element %d is %s: the commands ran out of order", i, v)
		}
	}
	if errs := s.RunCommands(context.Background(), nil); len(errs) != 0 {
		t.Fatalf("RunCommands(nil) = %v, want no errors", errs)
	}
}

// testRunCommandsMapsLikeRun: a command's error reply is its own, mapped
// as Run maps it (WRONGTYPE a request error, another reply answered and
// not an outage, a refusal an outage); a nil reply is a success.
func testRunCommandsMapsLikeRun(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	cmds := [][]string{
		{"SET", "{c}:s", "v"},
		{"ZADD", "{c}:s", "1", "m"},           // WRONGTYPE
		{"GET", "{c}:missing"},                // nil
		{"PEXPIRE", "{c}:s", "60000", "NX"},   // 1
		{"PEXPIRE", "{c}:s", "1000", "GT"},    // 0: not greater
		{"HOLDFASTNOSUCHCOMMAND", "{c}:s"},    // an error reply
		{"ZADD", "{c}:z", "1", "m", "2", "n"}, // 2
	}
	errs := s.RunCommands(context.Background(), cmds)
	if len(errs) != len(cmds) {
		t.Fatalf("got %d errors, want %d", len(errs), len(cmds))
	}
	for i, err := range errs {
		var se *core.StoreError
		switch i {
		case 1:
			if !errors.Is(err, core.ErrWrongType) {
				t.Errorf("command %d %v: %v, want ErrWrongType", i, cmds[i], err)
			}
		case 5:
			if err == nil || errors.Is(err, core.ErrStoreUnavailable) || !errors.As(err, &se) || !se.Answered {
				t.Errorf("command %d %v: %v, want an answered error reply", i, cmds[i], err)
			}
		default:
			if err != nil {
				t.Errorf("command %d %v: %v, want success", i, cmds[i], err)
			}
		}
	}
	if got := srv.Do(t, "ZCARD", "{c}:z"); got != "2" {
		t.Errorf("ZCARD = %s, want 2", got)
	}
	if ms, _ := strconv.Atoi(srv.Do(t, "PTTL", "{c}:s")); ms < 50_000 {
		t.Errorf("PTTL = %d, want the NX's 60000 kept by the GT", ms)
	}
	// A refusal is an outage, as for Run.
	srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	defer srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	errs = s.RunCommands(context.Background(), [][]string{{"SET", "{c}:oom", strings.Repeat("x", 1000)}})
	var se *core.StoreError
	if !errors.Is(errs[0], core.ErrStoreUnavailable) || !errors.As(errs[0], &se) || se.Reason != "OOM" {
		t.Errorf("SET past maxmemory: %v, want ErrStoreUnavailable (OOM)", errs[0])
	}
}

func testRunCommandsCanceled(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i, err := range s.RunCommands(ctx, pushes("{c}:list", 1500)) {
		if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("command %d: %v, want ErrStoreUnavailable and context.Canceled", i, err)
		}
	}
	if n := srv.Do(t, "LLEN", "{c}:list"); n != "0" {
		t.Fatalf("LLEN = %s after a canceled RunCommands, want 0", n)
	}
}

// runCommandsFaults fails a server under a RunCommands of many pipelines:
// every command fails with ErrStoreUnavailable, not answered, within
// StallBound.
func runCommandsFaults(t *testing.T, h RedisHarness) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		fault    func(srv *redistest.Server)
	}{
		{"killed", 0, (*redistest.Server).Kill},
		{"paused_with_deadline", 50 * time.Millisecond, (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := h.NewStore(t, srv.URL(), StoreOptions{})
			for i, err := range s.RunCommands(context.Background(), pushes("{c}:warm", 10)) {
				if err != nil {
					t.Fatalf("healthy, command %d: %v", i, err)
				}
			}
			ctx, cancel := faulted(t, srv, tc.fault, tc.deadline)
			defer cancel()
			start := time.Now()
			errs := s.RunCommands(ctx, pushes("{c}:list", 3000))
			took := time.Since(start)
			for i, err := range errs {
				var se *core.StoreError
				if !errors.Is(err, core.ErrStoreUnavailable) || !errors.As(err, &se) || se.Answered {
					t.Fatalf("command %d: %v; want ErrStoreUnavailable, not answered", i, err)
				}
			}
			if took > StallBound {
				t.Fatalf("RunCommands of %d commands took %v, bound %v", len(errs), took, StallBound)
			}
			t.Logf("%d commands failed after %v; first: %v", len(errs), took, fmt.Sprint(errs[0]))
		})
	}
}

package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

var (
	scriptEcho = driver.NewScript("echo", "return {tonumber(ARGV[1]), #KEYS}", nil)
	scriptIncr = driver.NewScript("incr", "return {redis.call('INCR', KEYS[1])}", nil)
)

// echoCalls returns n calls of scriptEcho whose replies are {i, 1}.
func echoCalls(n int) []driver.Call {
	calls := make([]driver.Call, n)
	for i := range calls {
		calls[i] = driver.Call{Script: scriptEcho, Keys: []string{fmt.Sprintf("{e%d}:k", i)}, Args: []string{strconv.Itoa(i)}}
	}
	return calls
}

// pipelineTests are the tests of RunMany: outcomes in the order of calls,
// each as Run maps it, NOSCRIPT handled. runFaults holds RunMany's faults.
var pipelineTests = []redisTest{
	{"in_order", testRunManyInOrder},
	{"empty", testRunManyEmpty},
	{"maps_like_run", testRunManyMapsLikeRun},
	{"noscript", testRunManyNoScript},
	{"canceled", testRunManyCanceled},
}

func testRunManyInOrder(t *testing.T, h RedisHarness) {
	s := h.NewStore(t, redistest.Start(t).URL(), relaxed)
	const n = 5000
	res := s.RunMany(context.Background(), echoCalls(n))
	if len(res) != n {
		t.Fatalf("got %d results, want %d", len(res), n)
	}
	for i, r := range res {
		if r.Err != nil || !reflect.DeepEqual(r.Reply, []int64{int64(i), 1}) {
			t.Fatalf("call %d: %v, %v; want [%d 1]", i, r.Reply, r.Err, i)
		}
	}
}

func testRunManyEmpty(t *testing.T, h RedisHarness) {
	s := h.NewStore(t, redistest.Start(t).URL(), relaxed)
	for _, calls := range [][]driver.Call{nil, {}} {
		if res := s.RunMany(context.Background(), calls); len(res) != 0 {
			t.Fatalf("RunMany(%#v) = %v, want no results", calls, res)
		}
	}
}

// testRunManyMapsLikeRun checks each call's outcome against Run's for the
// same call: a failure of one call does not affect the others.
func testRunManyMapsLikeRun(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	srv.Do(t, "RPUSH", "{t}:list", "x")
	calls := []driver.Call{
		{Script: scriptInts, Keys: []string{"{t}:a"}, Args: []string{"1"}},
		{Script: scriptHSet, Keys: []string{"{t}:list"}},
		{Script: scriptString},
		{Script: scriptFail},
		{Script: scriptNil},
		{Script: scriptStrElem},
		{Script: scriptNumStr},
		{Script: scriptNested},
		{Script: scriptEmpty},
		{Script: scriptInts, Args: []string{"2"}},
	}
	want := []error{nil, core.ErrWrongType, core.ErrMalformedReply, nil, core.ErrMalformedReply, core.ErrMalformedReply, core.ErrMalformedReply, core.ErrMalformedReply, nil, nil}
	res := s.RunMany(context.Background(), calls)
	if len(res) != len(calls) {
		t.Fatalf("got %d results, want %d", len(res), len(calls))
	}
	for i, c := range calls {
		got := res[i]
		if want[i] != nil && !errors.Is(got.Err, want[i]) {
			t.Errorf("call %d (%s): error %v, want %v", i, c.Script.Name(), got.Err, want[i])
		}
		if errors.Is(got.Err, core.ErrStoreUnavailable) {
			t.Errorf("call %d (%s): %v", i, c.Script.Name(), got.Err)
		}
		reply, err := s.Run(context.Background(), c.Script, c.Keys, c.Args)
		if fmt.Sprint(err) != fmt.Sprint(got.Err) || !reflect.DeepEqual(reply, got.Reply) {
			t.Errorf("call %d (%s): RunMany gave %v, %v; Run gives %v, %v", i, c.Script.Name(), got.Reply, got.Err, reply, err)
		}
		t.Logf("call %d (%s): %v, %v", i, c.Script.Name(), got.Reply, got.Err)
	}
	if res[3].Err == nil {
		t.Errorf("error_reply: no error")
	}
}

// testRunManyNoScript runs calls of two scripts the server has not cached,
// on a fresh server and after SCRIPT FLUSH: every call runs exactly once and
// no NOSCRIPT reaches the caller.
func testRunManyNoScript(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	const n = 2500 // several pipelines
	for round := range 2 {
		if round == 1 {
			srv.Do(t, "SCRIPT", "FLUSH")
		}
		calls := make([]driver.Call, n)
		for i := range calls {
			calls[i] = driver.Call{Script: scriptIncr, Keys: []string{fmt.Sprintf("{r%d:%d}:n", round, i)}}
			if i%3 == 0 {
				calls[i] = driver.Call{Script: scriptEcho, Args: []string{strconv.Itoa(i)}}
			}
		}
		for i, r := range s.RunMany(context.Background(), calls) {
			want := []int64{1} // INCR of a new key: run once
			if i%3 == 0 {
				want = []int64{int64(i), 0}
			}
			if r.Err != nil || !reflect.DeepEqual(r.Reply, want) {
				t.Fatalf("round %d, call %d: %v, %v; want %v", round, i, r.Reply, r.Err, want)
			}
		}
	}
	if got := srv.Do(t, "SCRIPT", "EXISTS", scriptIncr.SHA1(), scriptEcho.SHA1()); got != "[1 1]" {
		t.Fatalf("SCRIPT EXISTS = %s, want [1 1]", got)
	}
}

func testRunManyCanceled(t *testing.T, h RedisHarness) {
	s := h.NewStore(t, redistest.Start(t).URL(), relaxed)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i, r := range s.RunMany(ctx, echoCalls(1500)) {
		if !errors.Is(r.Err, core.ErrStoreUnavailable) || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("call %d: %v, want ErrStoreUnavailable and context.Canceled", i, r.Err)
		}
	}
}

// runManyFaults fails a server under a RunMany of many pipelines: every
// call fails with ErrStoreUnavailable within StallBound.
func runManyFaults(t *testing.T, h RedisHarness) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		fault    func(srv *redistest.Server)
	}{
		{"killed", 0, (*redistest.Server).Kill},
		{"killed_with_deadline", 50 * time.Millisecond, (*redistest.Server).Kill},
		{"paused_with_deadline", 50 * time.Millisecond, (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := h.NewStore(t, srv.URL(), StoreOptions{})
			// A small healthy batch leaves a pooled connection to fail
			// on; the client's short deadlines make a large one flaky
			// on a busy machine.
			for i, r := range s.RunMany(context.Background(), echoCalls(10)) {
				if r.Err != nil {
					t.Fatalf("healthy, call %d: %v", i, r.Err)
				}
			}
			calls := echoCalls(3000)
			ctx, cancel := faulted(t, srv, tc.fault, tc.deadline)
			defer cancel()
			start := time.Now()
			res := s.RunMany(ctx, calls)
			took := time.Since(start)
			for i, r := range res {
				if !errors.Is(r.Err, core.ErrStoreUnavailable) {
					t.Fatalf("call %d: %v, %v; want ErrStoreUnavailable", i, r.Reply, r.Err)
				}
			}
			if took > StallBound {
				t.Fatalf("RunMany of %d calls took %v, bound %v", len(calls), took, StallBound)
			}
			t.Logf("%d calls failed after %v; first: %v", len(calls), took, res[0].Err)
		})
	}
}

// faulted injects fault into srv, resumed when t ends, and returns the
// context of the calls made under it: with deadline d, none if 0.
func faulted(t *testing.T, srv *redistest.Server, fault func(*redistest.Server), d time.Duration) (context.Context, context.CancelFunc) {
	fault(srv)
	t.Cleanup(srv.Resume)
	if d > 0 {
		return context.WithTimeout(context.Background(), d)
	}
	return context.WithCancel(context.Background())
}

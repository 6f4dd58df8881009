package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/pipeline"
)

func TestChunked(t *testing.T) {
	for _, tc := range []struct{ n, chunk, workers, wantChunks int }{
		{0, 250, 2, 0},
		{1, 250, 2, 1},
		{250, 250, 2, 1},
		{251, 250, 2, 2},
		{1000, 250, 2, 4},
		{1000, 100, 4, 10},
		{1000, 1000, 1, 1},
		{999, 7, 0, 143},
		{10, 3, 8, 4},
	} {
		calls := make([]int, tc.n)
		for i := range calls {
			calls[i] = i
		}
		var chunks, inFlight, most atomic.Int64
		out := pipeline.Chunked(calls, pipeline.Sizing{Chunk: tc.chunk, Workers: tc.workers}, func(calls []int, out []string) {
			chunks.Add(1)
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			if len(calls) == 0 || len(calls) > tc.chunk || len(out) != len(calls) {
				t.Errorf("%+v: chunk of %d calls, %d outcomes", tc, len(calls), len(out))
			}
			for i, c := range calls {
				out[i] = fmt.Sprint(c)
			}
		})
		if len(out) != tc.n || int(chunks.Load()) != tc.wantChunks {
			t.Errorf("%+v: %d outcomes in %d chunks, want %d in %d", tc, len(out), chunks.Load(), tc.n, tc.wantChunks)
		}
		for i, o := range out {
			if o != fmt.Sprint(i) {
				t.Fatalf("%+v: outcome %d is %q", tc, i, o)
			}
		}
		if limit := max(tc.workers, 1); most.Load() > int64(limit) {
			t.Errorf("%+v: %d chunks in flight, limit %d", tc, most.Load(), limit)
		}
	}
}

// fakeRedis is a server with a script cache for Batch: a call of a script it
// has not loaded is refused with NOSCRIPT.
type fakeRedis struct {
	mu      sync.Mutex
	loaded  map[*driver.Script]bool
	loads   map[*driver.Script]int
	execs   [][]int
	loadErr error
}

var errNoScript = errors.New("NOSCRIPT No matching script")

func (f *fakeRedis) exec(_ context.Context, calls []driver.Call, idx []int, out []driver.CallResult) (refused []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execs = append(f.execs, append([]int(nil), idx...))
	for _, i := range idx {
		if !f.loaded[calls[i].Script] {
			out[i] = driver.CallResult{Err: errNoScript}
			refused = append(refused, i)
			continue
		}
		out[i] = driver.CallResult{Reply: []int64{int64(i)}}
	}
	return refused
}

func (f *fakeRedis) load(_ context.Context, sc *driver.Script) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads[sc]++
	if f.loadErr != nil {
		return f.loadErr
	}
	f.loaded[sc] = true
	return nil
}

func classify(name string, err error) error { return fmt.Errorf("%s: %w", name, err) }

func TestBatchNoScript(t *testing.T) {
	a := driver.NewScript("a", "return {1}", nil)
	b := driver.NewScript("b", "return {2}", nil)
	calls := []driver.Call{{Script: a}, {Script: b}, {Script: a}, {Script: b}, {Script: a}}
	t.Run("reloaded_once", func(t *testing.T) {
		f := &fakeRedis{loaded: map[*driver.Script]bool{b: true}, loads: map[*driver.Script]int{}}
		res := pipeline.Batch{Exec: f.exec, Load: f.load, Classify: classify}.RunMany(context.Background(), calls, pipeline.Sizing{Chunk: 10, Workers: 1})
		for i, r := range res {
			if r.Err != nil || len(r.Reply) != 1 || r.Reply[0] != int64(i) {
				t.Errorf("call %d: %v, %v", i, r.Reply, r.Err)
			}
		}
		if f.loads[a] != 1 || f.loads[b] != 0 {
			t.Errorf("loads: a %d, b %d; want 1, 0", f.loads[a], f.loads[b])
		}
		if fmt.Sprint(f.execs) != "[[0 1 2 3 4] [0 2 4]]" {
			t.Errorf("pipelines sent: %v, want the whole chunk, then the refused calls", f.execs)
		}
	})
	t.Run("load_fails", func(t *testing.T) {
		boom := errors.New("boom")
		f := &fakeRedis{loaded: map[*driver.Script]bool{b: true}, loads: map[*driver.Script]int{}, loadErr: boom}
		res := pipeline.Batch{Exec: f.exec, Load: f.load, Classify: classify}.RunMany(context.Background(), calls, pipeline.Sizing{Chunk: 10, Workers: 1})
		for i, r := range res {
			if calls[i].Script == b {
				if r.Err != nil {
					t.Errorf("call %d: %v", i, r.Err)
				}
				continue
			}
			if !errors.Is(r.Err, boom) || !strings.HasPrefix(r.Err.Error(), "a: SCRIPT LOAD: ") {
				t.Errorf("call %d: %v, want the classified load error", i, r.Err)
			}
		}
		if f.loads[a] != 1 || len(f.execs) != 1 {
			t.Errorf("loads of a %d, pipelines %d; want 1, 1", f.loads[a], len(f.execs))
		}
	})
}

// replyError is a Redis error reply of a fake client.
type replyError struct{ msg string }

func (e *replyError) Error() string { return e.msg }

var errNil = errors.New("nil reply")

var fakeErrors = pipeline.Errors{
	Prefix: "fake",
	IsNil:  func(err error) bool { return errors.Is(err, errNil) },
	Reply: func(err error) (string, bool) {
		var rerr *replyError
		if !errors.As(err, &rerr) {
			return "", false
		}
		return rerr.msg, true
	},
}

// TestClassify: one case per class and reason of the table in
// docs/errors.md, each checked for its class, its reason, whether the
// store answered, the sentinel it wraps and that it keeps its cause.
func TestClassify(t *testing.T) {
	type want struct {
		class    core.ErrorClass
		reason   string
		answered bool
		sentinel error // nil: none of core's
	}
	unavailable := func(reason string) want { return want{core.ClassUnavailable, reason, true, core.ErrStoreUnavailable} }
	for _, tc := range []struct {
		err  error
		want want
	}{
		{errNil, want{core.ClassUnknown, "malformed", true, core.ErrMalformedReply}},
		{context.DeadlineExceeded, want{core.ClassUnavailable, "deadline", false, core.ErrStoreUnavailable}},
		{os.ErrDeadlineExceeded, want{core.ClassUnavailable, "deadline", false, core.ErrStoreUnavailable}},
		{context.Canceled, want{core.ClassUnavailable, "canceled", false, core.ErrStoreUnavailable}},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), want{core.ClassUnavailable, "network", false, core.ErrStoreUnavailable}},
		{&replyError{"WRONGTYPE Operation against a key holding the wrong kind of value"}, want{core.ClassRequest, "WRONGTYPE", true, core.ErrWrongType}},
		{&replyError{"OOM command not allowed when used memory > 'maxmemory'. script: 71f, on @user_script:1."}, unavailable("OOM")},
		{&replyError{"READONLY You can't write against a read only replica."}, unavailable("READONLY")},
		{&replyError{"LOADING Redis is loading the dataset in memory"}, unavailable("LOADING")},
		{&replyError{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."}, unavailable("BUSY")},
		{&replyError{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."}, unavailable("MASTERDOWN")},
		{&replyError{"CLUSTERDOWN The cluster is down"}, unavailable("CLUSTERDOWN")},
		{&replyError{"TRYAGAIN Multiple keys request during rehashing of slot"}, unavailable("TRYAGAIN")},
		{&replyError{"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."}, unavailable("MISCONF")},
		{&replyError{"NOREPLICAS Not enough good replicas to write."}, unavailable("NOREPLICAS")},
		{&replyError{"NOPERM this user has no permissions to run the 'evalsha' command"}, unavailable("NOPERM")},
		{&replyError{"NOAUTH Authentication required."}, unavailable("NOAUTH")},
		{&replyError{"WRONGPASS invalid username-password pair or user is disabled."}, unavailable("WRONGPASS")},
		{&replyError{"ERR invalid password"}, unavailable("WRONGPASS")},
		{&replyError{"ERR max number of clients reached"}, unavailable("MAXCLIENTS")},
		{&replyError{"max number of clients reached"}, unavailable("MAXCLIENTS")}, // rueidis strips "ERR "
		{&replyError{"STALE holdfast: the call ran after its deadline"}, unavailable("STALE")},
		{&replyError{"ERR user script failed: boom"}, want{core.ClassUnknown, "unknown", true, nil}},
		{&replyError{"OOMKILLER is not a code"}, want{core.ClassUnknown, "unknown", true, nil}},
		{fmt.Errorf("wrapped: %w", &replyError{"BUSY"}), unavailable("BUSY")},
	} {
		got := fakeErrors.Classify("s", tc.err)
		se, ok := errors.AsType[*core.StoreError](got)
		if !ok {
			t.Fatalf("%v: %T, want a *core.StoreError", tc.err, got)
		}
		if w := tc.want; se.Class != w.class || se.Reason != w.reason || se.Answered != w.answered {
			t.Errorf("%v: class %v reason %q answered %v; want %v %q %v", tc.err, se.Class, se.Reason, se.Answered, w.class, w.reason, w.answered)
		}
		if core.ClassOf(got) != tc.want.class || core.ReasonOf(got) != tc.want.reason {
			t.Errorf("%v: ClassOf %v ReasonOf %q", tc.err, core.ClassOf(got), core.ReasonOf(got))
		}
		// A nil reply is reported as a malformed reply, without the
		// client's nil error.
		if tc.err != errNil && !errors.Is(got, tc.err) {
			t.Errorf("%v: %v does not keep the cause", tc.err, got)
		}
		for _, sentinel := range []error{core.ErrMalformedReply, core.ErrStoreUnavailable, core.ErrWrongType} {
			if errors.Is(got, sentinel) != (sentinel == tc.want.sentinel) {
				t.Errorf("%v: %v; want sentinel %v", tc.err, got, tc.want.sentinel)
			}
		}
		if !strings.Contains(got.Error(), "fake: s: ") {
			t.Errorf("%v: %q does not name the client and script", tc.err, got)
		}
	}
}

// reasons is every reason ClassifyReply may return: the metric label's
// whole set.
func reasons() map[string]bool {
	r := map[string]bool{"WRONGTYPE": true, "MAXCLIENTS": true, "unknown": true}
	for _, v := range pipeline.Refusals {
		r[v] = true
	}
	return r
}

// FuzzClassifyReply: any error text gets a class and a reason from the
// bounded set, and never the text itself.
func FuzzClassifyReply(f *testing.F) {
	for _, s := range []string{"OOM command not allowed", "ERR max number of clients reached", "WRONGTYPE x", "", "ERR ", " ", "BUSY", "ERR NOPERM x", "\x00\xff"} {
		f.Add(s)
	}
	known := reasons()
	f.Fuzz(func(t *testing.T, msg string) {
		class, reason := pipeline.ClassifyReply(msg)
		if class != core.ClassRequest && class != core.ClassUnavailable && class != core.ClassUnknown {
			t.Fatalf("%q: class %v", msg, class)
		}
		if !known[reason] {
			t.Fatalf("%q: reason %q is outside the bounded set", msg, reason)
		}
		err := fakeErrors.Classify("s", &replyError{msg})
		if core.ClassOf(err) != class || core.ReasonOf(err) != reason {
			t.Fatalf("%q: Classify gives %v %q, ClassifyReply %v %q", msg, core.ClassOf(err), core.ReasonOf(err), class, reason)
		}
	})
}

// TestChunkedByWeight: a chunk ends before its weight passes MaxArgs, holds
// at least one call however heavy, and still at most Chunk calls.
func TestChunkedByWeight(t *testing.T) {
	weights := []int{10, 10, 10, 30, 100, 1, 1, 1, 1, 1}
	var got [][]int
	var mu sync.Mutex
	pipeline.ChunkedBy(weights, pipeline.Sizing{Chunk: 4, Workers: 1, MaxArgs: 30}, func(w int) int { return w },
		func(calls []int, out []bool) {
			mu.Lock()
			got = append(got, append([]int(nil), calls...))
			mu.Unlock()
		})
	want := [][]int{{10, 10, 10}, {30}, {100}, {1, 1, 1, 1}, {1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("chunks %v, want %v", got, want)
	}
}

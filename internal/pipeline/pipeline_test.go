package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/holdfast/holdfast/core"
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
	loaded  map[*core.Script]bool
	loads   map[*core.Script]int
	execs   [][]int
	loadErr error
}

var errNoScript = errors.New("NOSCRIPT No matching script")

func (f *fakeRedis) exec(_ context.Context, calls []core.Call, idx []int, out []core.CallResult) (refused []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execs = append(f.execs, append([]int(nil), idx...))
	for _, i := range idx {
		if !f.loaded[calls[i].Script] {
			out[i] = core.CallResult{Err: errNoScript}
			refused = append(refused, i)
			continue
		}
		out[i] = core.CallResult{Reply: []int64{int64(i)}}
	}
	return refused
}

func (f *fakeRedis) load(_ context.Context, sc *core.Script) error {
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
	a := core.NewScript("a", "return {1}", nil)
	b := core.NewScript("b", "return {2}", nil)
	calls := []core.Call{{Script: a}, {Script: b}, {Script: a}, {Script: b}, {Script: a}}
	t.Run("reloaded_once", func(t *testing.T) {
		f := &fakeRedis{loaded: map[*core.Script]bool{b: true}, loads: map[*core.Script]int{}}
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
		f := &fakeRedis{loaded: map[*core.Script]bool{b: true}, loads: map[*core.Script]int{}, loadErr: boom}
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
	Unavailable: []string{"LOADING", "BUSY"},
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err    error
		want   error // nil: none of core's errors
		prefix string
	}{
		{errNil, core.ErrMalformedReply, ""},
		{context.DeadlineExceeded, core.ErrStoreUnavailable, ""},
		{errors.New("connection refused"), core.ErrStoreUnavailable, ""},
		{&replyError{"WRONGTYPE Operation against a key holding the wrong kind of value"}, core.ErrWrongType, ""},
		{&replyError{"LOADING Redis is loading the dataset in memory"}, core.ErrStoreUnavailable, ""},
		{&replyError{"BUSY Redis is busy running a script"}, core.ErrStoreUnavailable, ""},
		{&replyError{"ERR user script failed: boom"}, nil, "fake: s: "},
		{fmt.Errorf("wrapped: %w", &replyError{"BUSY"}), core.ErrStoreUnavailable, ""},
	} {
		got := fakeErrors.Classify("s", tc.err)
		// A nil reply is reported as a malformed reply, without the
		// client's nil error.
		if tc.err != errNil && !errors.Is(got, tc.err) {
			t.Errorf("%v: %v does not keep the cause", tc.err, got)
		}
		for _, sentinel := range []error{core.ErrMalformedReply, core.ErrStoreUnavailable, core.ErrWrongType} {
			if errors.Is(got, sentinel) != (sentinel == tc.want) {
				t.Errorf("%v: %v; want %v", tc.err, got, tc.want)
			}
		}
		if tc.prefix != "" && !strings.HasPrefix(got.Error(), tc.prefix) {
			t.Errorf("%v: %q, want prefix %q", tc.err, got, tc.prefix)
		}
	}
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

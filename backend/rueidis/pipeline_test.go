package rueidis_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
)

var (
	scriptEcho = core.NewScript("echo", "return {tonumber(ARGV[1]), #KEYS}", nil)
	scriptIncr = core.NewScript("incr", "return {redis.call('INCR', KEYS[1])}", nil)
	// scriptReconcile has the shape of a reconciliation: write a hash, set
	// its expiry.
	scriptReconcile = core.NewScript("reconcile", `
redis.call('HSET', KEYS[1], 'n', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1}`, nil)
)

// echoCalls returns n calls of scriptEcho whose replies are {i, 1}.
func echoCalls(n int) []core.Call {
	calls := make([]core.Call, n)
	for i := range calls {
		calls[i] = core.Call{Script: scriptEcho, Keys: []string{fmt.Sprintf("{e%d}:k", i)}, Args: []string{strconv.Itoa(i)}}
	}
	return calls
}

func TestRunManyInOrder(t *testing.T) {
	t.Parallel()
	s := newStore(t, redistest.Start(t).URL(), relaxed)
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

func TestRunManyEmpty(t *testing.T) {
	t.Parallel()
	s := newStore(t, redistest.Start(t).URL(), relaxed)
	for _, calls := range [][]core.Call{nil, {}} {
		if res := s.RunMany(context.Background(), calls); len(res) != 0 {
			t.Fatalf("RunMany(%#v) = %v, want no results", calls, res)
		}
	}
}

// TestRunManyMapsLikeRun checks each call's outcome against Run's for the
// same call: a failure of one call does not affect the others.
func TestRunManyMapsLikeRun(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, srv.URL(), relaxed)
	srv.Do(t, "RPUSH", "{t}:list", "x")
	calls := []core.Call{
		{Script: scriptInts, Keys: []string{"{t}:a"}, Args: []string{"1"}},
		{Script: scriptHSet, Keys: []string{"{t}:list"}},
		{Script: scriptString},
		{Script: scriptFail},
		{Script: scriptNil},
		{Script: scriptStrElem},
		{Script: scriptNested},
		{Script: scriptEmpty},
		{Script: scriptInts, Args: []string{"2"}},
	}
	want := []error{nil, core.ErrWrongType, core.ErrMalformedReply, nil, core.ErrMalformedReply, core.ErrMalformedReply, core.ErrMalformedReply, nil, nil}
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

// TestRunManyNoScript runs calls of two scripts the server has not cached,
// on a fresh server and after SCRIPT FLUSH: every call runs exactly once and
// no NOSCRIPT reaches the caller.
func TestRunManyNoScript(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, srv.URL(), relaxed)
	const n = 2500 // several pipelines
	for round := range 2 {
		if round == 1 {
			srv.Do(t, "SCRIPT", "FLUSH")
		}
		calls := make([]core.Call, n)
		for i := range calls {
			calls[i] = core.Call{Script: scriptIncr, Keys: []string{fmt.Sprintf("{r%d:%d}:n", round, i)}}
			if i%3 == 0 {
				calls[i] = core.Call{Script: scriptEcho, Args: []string{strconv.Itoa(i)}}
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

func TestRunManyFaults(t *testing.T) {
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
			s := newStore(t, srv.URL(), hfrueidis.ClientOptions{})
			// A small healthy batch leaves a pooled connection to fail
			// on; the client's short deadlines make a large one flaky
			// on a busy machine.
			for i, r := range s.RunMany(context.Background(), echoCalls(10)) {
				if r.Err != nil {
					t.Fatalf("healthy, call %d: %v", i, r.Err)
				}
			}
			calls := echoCalls(3000)
			tc.fault(srv)
			defer srv.Resume()
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			start := time.Now()
			res := s.RunMany(ctx, calls)
			took := time.Since(start)
			for i, r := range res {
				if !errors.Is(r.Err, core.ErrStoreUnavailable) {
					t.Fatalf("call %d: %v, %v; want ErrStoreUnavailable", i, r.Reply, r.Err)
				}
			}
			if took > stallBound {
				t.Fatalf("RunMany of %d calls took %v, bound %v", len(calls), took, stallBound)
			}
			t.Logf("%d calls failed after %v; first: %v", len(calls), took, res[0].Err)
		})
	}
}

func TestRunManyCanceled(t *testing.T) {
	t.Parallel()
	s := newStore(t, redistest.Start(t).URL(), relaxed)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i, r := range s.RunMany(ctx, echoCalls(1500)) {
		if !errors.Is(r.Err, core.ErrStoreUnavailable) || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("call %d: %v, want ErrStoreUnavailable and context.Canceled", i, r.Err)
		}
	}
}

// benchCalls is the size of a benchmark batch.
const benchCalls = 100_000

// reconcileCalls returns benchCalls calls of scriptReconcile on distinct
// keys.
func reconcileCalls() []core.Call {
	calls := make([]core.Call, benchCalls)
	for i := range calls {
		calls[i] = core.Call{Script: scriptReconcile, Keys: []string{fmt.Sprintf("{bench:%d}:h", i)}, Args: []string{strconv.Itoa(i), "60000"}}
	}
	return calls
}

// warmUp runs calls once, so that every sub-benchmark finds the keys
// created and the script cached: the first sub-benchmark is not charged for
// them.
func warmUp(b *testing.B, s core.Pipeliner, calls []core.Call) {
	for i, r := range s.RunMany(context.Background(), calls) {
		if r.Err != nil {
			b.Logf("warm-up, call %d: %v", i, r.Err)
			return
		}
	}
}

// pipelineSizings are the RunMany sizings the benchmarks compare: the
// default (zero), smaller chunks, and larger ones on one connection and on
// four.
var pipelineSizings = []struct{ chunk, workers int }{{0, 0}, {100, 4}, {1000, 1}, {1000, 4}}

// sizingName names the sub-benchmark of a sizing; chunk 0 is the default.
func sizingName(chunk, workers int) string {
	if chunk == 0 {
		return "RunMany"
	}
	return fmt.Sprintf("RunMany/chunk=%d,workers=%d", chunk, workers)
}

// BenchmarkRunMany measures one batch of 100k reconciliation-shaped calls
// on distinct keys, with the default client options: RunMany with the
// default pipeline sizing and others, and the same calls as concurrent Run
// calls from 256 goroutines. One op is the whole batch. failed/op counts
// calls that failed (a deadline), which a sizing must not cause.
func BenchmarkRunMany(b *testing.B) {
	const goroutines = 256
	srv := redistest.Start(b)
	s := newStore(b, srv.URL(), hfrueidis.ClientOptions{})
	calls := reconcileCalls()
	warmUp(b, s, calls)
	srv.Do(b, "CONFIG", "RESETSTAT")
	report := func(b *testing.B, failed int64, first error) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchCalls), "ns/call")
		b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
		if first != nil {
			b.Logf("%d calls failed; first: %v", failed, first)
		}
		b.Logf("server: %s", evalshaStats(srv.Do(b, "INFO", "commandstats")))
		srv.Do(b, "CONFIG", "RESETSTAT")
	}
	for _, sz := range pipelineSizings {
		b.Run(sizingName(sz.chunk, sz.workers), func(b *testing.B) {
			if sz.chunk > 0 {
				defer hfrueidis.SetPipelineSizing(sz.chunk, sz.workers)()
			}
			var failed int64
			var first error
			for b.Loop() {
				for _, r := range s.RunMany(context.Background(), calls) {
					if r.Err != nil {
						failed++
						first = cmp.Or(first, r.Err)
					}
				}
			}
			report(b, failed, first)
		})
	}
	b.Run(fmt.Sprintf("Run/goroutines=%d", goroutines), func(b *testing.B) {
		var failed atomic.Int64
		var first atomic.Pointer[error]
		for b.Loop() {
			var next atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < benchCalls; i = next.Add(1) - 1 {
						c := calls[i]
						if _, err := s.Run(context.Background(), c.Script, c.Keys, c.Args); err != nil {
							failed.Add(1)
							first.CompareAndSwap(nil, &err)
						}
					}
				})
			}
			wg.Wait()
		}
		var err error
		if p := first.Load(); p != nil {
			err = *p
		}
		report(b, failed.Load(), err)
	})
}

// BenchmarkRunManyLiveLatency measures what a batch does to live traffic:
// the latency of sequential Run calls on the same Store while RunMany runs
// 100k calls, for each sizing. It reports the median and 99th percentile.
func BenchmarkRunManyLiveLatency(b *testing.B) {
	s := newStore(b, redistest.Start(b).URL(), hfrueidis.ClientOptions{})
	calls := reconcileCalls()
	warmUp(b, s, calls)
	for _, sz := range pipelineSizings {
		b.Run(sizingName(sz.chunk, sz.workers), func(b *testing.B) {
			if sz.chunk > 0 {
				defer hfrueidis.SetPipelineSizing(sz.chunk, sz.workers)()
			}
			var lat []time.Duration
			var failed int
			for b.Loop() {
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						if _, err := s.Run(context.Background(), scriptInts, []string{"{live}:k"}, []string{"1"}); err != nil {
							failed++
						}
						lat = append(lat, time.Since(start))
					}
				}()
				s.RunMany(context.Background(), calls)
				close(stop)
				<-done
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
			b.ReportMetric(q(0.5), "live-p50-µs")
			b.ReportMetric(q(0.99), "live-p99-µs")
			b.ReportMetric(float64(failed)/float64(b.N), "live-failed/op")
		})
	}
}

// evalshaStats picks the EVALSHA line out of INFO commandstats.
func evalshaStats(info string) string {
	for line := range strings.Lines(info) {
		if strings.HasPrefix(line, "cmdstat_evalsha:") {
			return strings.TrimSpace(line)
		}
	}
	return "no EVALSHA stats"
}

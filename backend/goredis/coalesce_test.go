package goredis_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// relaxed are client options for tests that are not about deadlines: a
// busy machine running -race must not turn a slow reply into a failure.
var relaxed = goredis.ClientOptions{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, DialTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second}

// newClient returns a client on url with options o, closed when t ends.
func newClient(t testing.TB, url string, o goredis.ClientOptions) redis.UniversalClient {
	t.Helper()
	c, err := goredis.NewClient(url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// scriptEcho returns its first argument: a reply that shows which call it
// answers.
var scriptEcho = driver.NewScript("echo", "return {tonumber(ARGV[1]), #KEYS}", nil)

// tally counts the outcomes of decisions.
type tally struct{ admitted, denied, failed atomic.Int64 }

func (n *tally) add(r core.Result, err error) {
	switch {
	case err != nil:
		n.failed.Add(1)
	case r.Allowed:
		n.admitted.Add(1)
	default:
		n.denied.Add(1)
	}
}

// hammer runs calls(g, i) for i < perG on each of g < goroutines
// goroutines, started together.
func hammer(goroutines, perG int, call func(g, i int)) {
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-startGate
			for i := range perG {
				call(g, i)
			}
		})
	}
	close(startGate)
	wg.Wait()
}

// noRefill is a token bucket rate so slow (one token in about 11 days)
// that no token comes back during a test: the admitted count is the
// capacity exactly.
const noRefill = 1e-6

// waitNoFlushers fails t unless s's flusher goroutines have all exited
// within a generous bound: an idle Store runs none.
func waitNoFlushers(t *testing.T, s *goredis.Store) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); s.Flushers() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d flushers still running on an idle store", s.Flushers())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoalescedExact: 64 goroutines spend one token each on one hot key of
// a bucket of 1000 that does not refill; exactly 1000 are admitted, none
// fails, the calls share pipelines (far fewer round trips than calls), no
// pipeline holds more than MaxBatch calls, and no flusher outlives the load.
func TestCoalescedExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const goroutines, perG, capacity = 64, 40, 1000
	for _, tc := range []struct {
		name     string
		o        goredis.StoreOptions
		maxBatch int64
	}{
		{"defaults", goredis.StoreOptions{NoCollapse: true}, goredis.DefaultMaxBatch},
		{"one_pipeline_of_3", goredis.StoreOptions{Pipelines: 1, MaxBatch: 3, NoCollapse: true}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := goredis.NewWithOptions(newClient(t, srv.URL(), relaxed), tc.o)
			l, err := core.NewLimiter(s, core.Options{Prefix: "exact:"})
			if err != nil {
				t.Fatal(err)
			}
			p, err := tokenbucket.Policy("exact-"+tc.name, capacity, noRefill)
			if err != nil {
				t.Fatal(err)
			}
			var n tally
			hammer(goroutines, perG, func(int, int) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				n.add(l.Allow(ctx, p, "hot"))
			})
			const total = goroutines * perG
			pipes, queued := s.CoalesceStats()
			trips := total - queued + pipes
			t.Logf("admitted %d denied %d failed %d; %d calls: %d direct, %d in %d pipelines: %d round trips",
				n.admitted.Load(), n.denied.Load(), n.failed.Load(), total, total-queued, queued, pipes, trips)
			if n.failed.Load() != 0 || n.admitted.Load() != capacity || n.denied.Load() != total-capacity {
				t.Errorf("admitted %d denied %d failed %d, want %d, %d, 0", n.admitted.Load(), n.denied.Load(), n.failed.Load(), capacity, total-capacity)
			}
			if trips > total/2 {
				t.Errorf("%d round trips for %d calls, want at most half", trips, total)
			}
			if queued > pipes*tc.maxBatch {
				t.Errorf("%d calls in %d pipelines of at most %d", queued, pipes, tc.maxBatch)
			}
			waitNoFlushers(t, s)
		})
	}
}

// TestCoalescedFewCallers: calls made while at most DirectCalls are in
// flight never wait for a pipeline; every one is sent on its own, by one
// caller and by DirectCalls callers at once. With one caller more, some
// are queued.
func TestCoalescedFewCallers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		callers int
		queued  bool
	}{{1, false}, {goredis.DirectCalls, false}, {4 * goredis.DirectCalls, true}} {
		t.Run(fmt.Sprintf("callers=%d", tc.callers), func(t *testing.T) {
			t.Parallel()
			s := coalescing(newClient(t, redistest.Start(t).URL(), relaxed))
			l, err := core.NewLimiter(s, core.Options{Prefix: "few:"})
			if err != nil {
				t.Fatal(err)
			}
			p, err := tokenbucket.Policy("few", 50, noRefill)
			if err != nil {
				t.Fatal(err)
			}
			var n tally
			const total = 160
			hammer(tc.callers, total/tc.callers, func(int, int) { n.add(l.Allow(context.Background(), p, "k")) })
			if n.admitted.Load() != 50 || n.denied.Load() != total-50 || n.failed.Load() != 0 {
				t.Errorf("admitted %d denied %d failed %d, want 50, %d, 0", n.admitted.Load(), n.denied.Load(), n.failed.Load(), total-50)
			}
			pipes, queued := s.CoalesceStats()
			if !tc.queued && (pipes != 0 || queued != 0) {
				t.Errorf("%d callers sent %d calls in %d pipelines, want none", tc.callers, queued, pipes)
			}
			if tc.queued && queued == 0 {
				t.Errorf("%d callers sent no call in a pipeline", tc.callers)
			}
			waitNoFlushers(t, s)
		})
	}
}

// TestCoalescedScriptFlush: the server's script cache is flushed again and
// again while 32 goroutines run; every call still succeeds with its own
// reply, coalesced or not.
func TestCoalescedScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := coalescing(newClient(t, srv.URL(), relaxed))
	admin := newClient(t, srv.URL(), relaxed) // t.Fatal is not for the flushing goroutine
	stop := make(chan struct{})
	var flushes int
	flusherDone := make(chan struct{})
	go func() {
		defer close(flusherDone)
		for flushes < 200 {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
				t.Errorf("SCRIPT FLUSH: %v", err)
				return
			}
			flushes++
		}
	}()
	var failed atomic.Int64
	hammer(32, 60, func(g, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		want := int64(g*1000 + i)
		got, err := s.Run(ctx, scriptEcho, []string{fmt.Sprint("{f}:", g)}, []string{strconv.FormatInt(want, 10)})
		if err != nil || len(got) != 2 || got[0] != want || got[1] != 1 {
			if failed.Add(1) <= 5 {
				t.Errorf("goroutine %d call %d: %v, %v; want [%d 1]", g, i, got, err, want)
			}
		}
	})
	close(stop)
	<-flusherDone
	pipes, queued := s.CoalesceStats()
	// A pipeline that met NOSCRIPT loaded the script (RunMany); a direct
	// call sent EVAL.
	stats := srv.Do(t, "INFO", "commandstats")
	loads, evals := cmdCalls(stats, "script|load"), cmdCalls(stats, "eval")
	t.Logf("%d script flushes; %d calls in %d pipelines; %d SCRIPT LOAD, %d EVAL", flushes, queued, pipes, loads, evals)
	if failed.Load() != 0 {
		t.Errorf("%d calls failed", failed.Load())
	}
	if flushes == 0 || pipes == 0 || loads == 0 {
		t.Errorf("%d flushes, %d pipelines, %d SCRIPT LOAD: the test did not flush under coalesced calls", flushes, pipes, loads)
	}
}

// cmdCalls returns the calls of command cmd in the output of INFO
// commandstats, 0 if it has none.
func cmdCalls(info, cmd string) int {
	m := regexp.MustCompile(`(?m)^cmdstat_` + regexp.QuoteMeta(cmd) + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestCoalescedDeadlines: against a server that answers nothing (SIGSTOP),
// 64 concurrent callers with a 50 ms deadline all fail with
// ErrStoreUnavailable, promptly, whether they went direct or waited for a
// pipeline; once the server answers again, calls succeed.
func TestCoalescedDeadlines(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := coalescing(newClient(t, srv.URL(), goredis.ClientOptions{}))
	run := func(d time.Duration, i int) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		_, err := s.Run(ctx, scriptEcho, []string{"{d}:k"}, []string{strconv.Itoa(i)})
		return time.Since(start), err
	}
	if _, err := run(5*time.Second, 0); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	pipesBefore, _ := s.CoalesceStats()
	srv.Pause()
	var slowest atomic.Int64
	var wrong atomic.Int64
	hammer(64, 3, func(g, i int) {
		took, err := run(50*time.Millisecond, g)
		if !errors.Is(err, core.ErrStoreUnavailable) {
			if wrong.Add(1) <= 5 {
				t.Errorf("paused, goroutine %d call %d: %v, want ErrStoreUnavailable", g, i, err)
			}
		}
		for old := slowest.Load(); int64(took) > old && !slowest.CompareAndSwap(old, int64(took)); old = slowest.Load() {
		}
	})
	pipesPaused, _ := s.CoalesceStats()
	t.Logf("paused: slowest call %v; %d pipelines sent", time.Duration(slowest.Load()), pipesPaused-pipesBefore)
	if pipesPaused == pipesBefore {
		t.Error("paused: no call went through a pipeline; the coalesced path was not exercised")
	}
	if took := time.Duration(slowest.Load()); took > storetest.StallBound {
		t.Errorf("paused: slowest call took %v, bound %v", took, storetest.StallBound)
	}
	srv.Resume()
	// go-redis may fail calls fast for up to about a second after failed
	// dials (see NewClient); then every call succeeds.
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, err := run(5*time.Second, 0)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after resume: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var failed atomic.Int64
	hammer(64, 3, func(g, i int) {
		if _, err := run(5*time.Second, g); err != nil && failed.Add(1) <= 5 {
			t.Errorf("after resume, goroutine %d call %d: %v", g, i, err)
		}
	})
	waitNoFlushers(t, s)
}

// TestCoalescedCanceled: a caller whose context is already canceled gets
// ErrStoreUnavailable wrapping context.Canceled on the coalesced path too,
// and the others are not disturbed.
func TestCoalescedCanceled(t *testing.T) {
	t.Parallel()
	s := coalescing(newClient(t, redistest.Start(t).URL(), relaxed))
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	var wrong atomic.Int64
	hammer(16, 20, func(g, i int) {
		ctx := context.Background()
		if g%2 == 1 {
			ctx = canceled
		}
		got, err := s.Run(ctx, scriptEcho, nil, []string{strconv.Itoa(i)})
		switch {
		case g%2 == 1 && (!errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, context.Canceled)):
			if wrong.Add(1) <= 5 {
				t.Errorf("canceled: %v, want ErrStoreUnavailable and context.Canceled", err)
			}
		case g%2 == 0 && (err != nil || len(got) != 2 || got[0] != int64(i)):
			if wrong.Add(1) <= 5 {
				t.Errorf("live: %v, %v, want [%d 0]", got, err, i)
			}
		}
	})
}

// TestCoalescedCluster: on a 3-master Redis Cluster, 64 goroutines spend on
// 8 keys spread over the slots; go-redis splits each pipeline by node, and
// every key admits exactly its capacity.
func TestCoalescedCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	s := coalescing(newClient(t, c.URL(), relaxed))
	l, err := core.NewLimiter(s, core.Options{Prefix: "cl:"})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, perG, keys, capacity = 64, 20, 8, 100
	p, err := tokenbucket.Policy("cl", capacity, noRefill)
	if err != nil {
		t.Fatal(err)
	}
	var n [keys]tally
	hammer(goroutines, perG, func(g, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		k := (g*perG + i) % keys
		n[k].add(l.Allow(ctx, p, fmt.Sprint("key-", k)))
	})
	const each = goroutines * perG / keys
	for k := range n {
		if a, d, f := n[k].admitted.Load(), n[k].denied.Load(), n[k].failed.Load(); a != capacity || d != each-capacity || f != 0 {
			t.Errorf("key-%d: admitted %d denied %d failed %d, want %d, %d, 0", k, a, d, f, capacity, each-capacity)
		}
	}
	pipes, queued := s.CoalesceStats()
	t.Logf("%d calls in %d pipelines", queued, pipes)
	if pipes == 0 {
		t.Error("no pipeline sent")
	}
}

func TestNewWithOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	for _, tc := range []struct {
		o                   goredis.StoreOptions
		on                  bool
		pipelines, maxBatch int
	}{
		{goredis.StoreOptions{}, true, goredis.DefaultPipelines, goredis.DefaultMaxBatch},
		{goredis.StoreOptions{Pipelines: 1, MaxBatch: 2}, true, 1, 2},
		{goredis.StoreOptions{Pipelines: -1, MaxBatch: -5}, true, goredis.DefaultPipelines, goredis.DefaultMaxBatch},
		{goredis.StoreOptions{NoCoalesce: true, Pipelines: 3}, false, 0, 0},
	} {
		on, pipelines, maxBatch := goredis.NewWithOptions(c, tc.o).CoalesceSettings()
		if on != tc.on || pipelines != tc.pipelines || maxBatch != tc.maxBatch {
			t.Errorf("%+v: coalesce %v, %d pipelines of %d; want %v, %d, %d", tc.o, on, pipelines, maxBatch, tc.on, tc.pipelines, tc.maxBatch)
		}
	}
	if on, _, _ := goredis.New(c).CoalesceSettings(); !on {
		t.Error("New does not coalesce")
	}
}

// BenchmarkRunCoalesced compares a Store that sends every call on its own
// with one that coalesces, on one hot key through a Limiter: one caller,
// and 32 callers per GOMAXPROCS. The coalesced runs report the calls per
// pipeline.
func BenchmarkRunCoalesced(b *testing.B) {
	url := redistest.Start(b).URL()
	p, err := tokenbucket.Policy("bench", 1_000_000, 1_000_000)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		o    goredis.StoreOptions
	}{{"direct", goredis.StoreOptions{NoCoalesce: true, NoCollapse: true}}, {"coalesced", goredis.StoreOptions{NoCollapse: true}},
		{"coalesced_8_pipelines", goredis.StoreOptions{Pipelines: 8, NoCollapse: true}}} {
		s := goredis.NewWithOptions(newClient(b, url, goredis.ClientOptions{}), bc.o)
		l, err := core.NewLimiter(s, core.Options{Prefix: "bench:"})
		if err != nil {
			b.Fatal(err)
		}
		report := func(b *testing.B, pipes0, calls0 int64) {
			if pipes, calls := s.CoalesceStats(); pipes > pipes0 {
				b.ReportMetric(float64(calls-calls0)/float64(pipes-pipes0), "calls/pipeline")
			}
		}
		b.Run(bc.name+"/1_caller", func(b *testing.B) {
			pipes0, calls0 := s.CoalesceStats()
			ctx := context.Background()
			for b.Loop() {
				if _, err := l.Allow(ctx, p, "hot"); err != nil {
					b.Fatal(err)
				}
			}
			report(b, pipes0, calls0)
		})
		b.Run(bc.name+"/32_callers_per_proc", func(b *testing.B) {
			pipes0, calls0 := s.CoalesceStats()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := l.Allow(ctx, p, "hot"); err != nil {
						b.Error(err)
						return
					}
				}
			})
			report(b, pipes0, calls0)
		})
	}
}

// TestCoalescedStall: while every flusher waits on a stalled round trip
// (the server paused), a call still queued after a few milliseconds starts
// another flusher instead of waiting a whole round trip to be sent; once
// the server answers every call succeeds and the extra flushers leave.
func TestCoalescedStall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := goredis.NewWithOptions(newClient(t, srv.URL(), goredis.ClientOptions{ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second}), goredis.StoreOptions{Pipelines: 1, NoCollapse: true})
	if _, err := s.Run(context.Background(), scriptEcho, []string{"{s}:k"}, []string{"0"}); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	srv.Pause()
	var wg sync.WaitGroup
	var failed atomic.Int64
	call := func(g int) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			got, err := s.Run(ctx, scriptEcho, []string{"{s}:k"}, []string{strconv.Itoa(g)})
			if (err != nil || len(got) != 2 || got[0] != int64(g)) && failed.Add(1) <= 5 {
				t.Errorf("call %d: %v %v", g, got, err)
			}
		})
	}
	// One call sent on its own, one in the one pipeline allowed: both
	// stalled. Then calls queue behind them.
	call(0)
	time.Sleep(50 * time.Millisecond)
	call(1)
	time.Sleep(50 * time.Millisecond)
	for g := 2; g < 16; g++ {
		call(g)
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	stalled := s.Flushers()
	srv.Resume()
	wg.Wait()
	if stalled < 2 {
		t.Errorf("%d flushers while a pipeline was stalled with calls queued behind it; want more than the 1 configured", stalled)
	}
	waitNoFlushers(t, s)
}

// coalescing is a Store on c that coalesces, with the hot key's decisions
// not collapsed: the coalescer's tests see every call.
func coalescing(c redis.UniversalClient) *goredis.Store {
	return goredis.NewWithOptions(c, goredis.StoreOptions{NoCollapse: true})
}

package fallback_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// callTimeout is generous: under -race on a busy machine a slow call would
// trip a breaker while Redis is healthy, which is a different test.
const callTimeout = 300 * time.Millisecond

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) } // a dead Redis is the point here

// newStore returns a store of the named backend on url, closed at the end.
func newStore(t *testing.T, backend, url string) driver.Store {
	t.Helper()
	switch backend {
	case "goredis":
		c, err := goredis.NewClient(url, goredis.ClientOptions{DialTimeout: callTimeout, ReadTimeout: callTimeout, WriteTimeout: callTimeout}) // the dial as the rueidis one: the default 100 ms has timed out on a loaded machine
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	case "rueidis":
		c, err := rueidis.NewClient(url, rueidis.ClientOptions{DialTimeout: callTimeout, ConnWriteTimeout: callTimeout}) // a cluster client reads the slot map at once; rueidis drops a connection whose reply takes longer than ConnWriteTimeout
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return rueidis.New(c)
	}
	t.Fatalf("unknown backend %q", backend)
	return nil
}

// instances is N fallback Limiters, each with its own client, and the
// breaker transitions each went through, with when each happened.
type instances struct {
	lims []*fallback.Limiter
	mu   sync.Mutex
	seen [][]fallback.State
	at   [][]time.Time // at[i][j]: when seen[i][j] happened
}

func startInstances(t *testing.T, backend, url string, n int, stateDir string) *instances {
	t.Helper()
	urls := make([]string, n)
	for i := range urls {
		urls[i] = url
	}
	return startInstancesAt(t, backend, urls, stateDir)
}

// startInstancesAt starts one instance per URL: instance i reaches Redis
// through urls[i] (a proxy of its own, in the network fault tests).
func startInstancesAt(t *testing.T, backend string, urls []string, stateDir string) *instances {
	t.Helper()
	return startInstancesWith(t, urls, stateDir, callTimeout, func(url string) driver.Store { return newStore(t, backend, url) })
}

// startInstancesWith starts one instance per URL on the store store makes
// for it, with call deadline timeout (0: the default).
func startInstancesWith(t *testing.T, urls []string, stateDir string, timeout time.Duration, store func(url string) driver.Store) *instances {
	t.Helper()
	n := len(urls)
	in := &instances{seen: make([][]fallback.State, n), at: make([][]time.Time, n)}
	for i, url := range urls {
		l, err := fallback.New(store(url), fallback.Options{
			ID:        fmt.Sprintf("app%d", i+1),
			Heartbeat: 200 * time.Millisecond,
			Breaker: fallback.BreakerOptions{
				CallTimeout:   timeout,
				ProbeInterval: 200 * time.Millisecond,
				Jitter:        50 * time.Millisecond,
				OnStateChange: func(_, to fallback.State) {
					in.mu.Lock()
					in.seen[i] = append(in.seen[i], to)
					in.at[i] = append(in.at[i], time.Now())
					in.mu.Unlock()
				},
			},
			ExpectedInstances: n,
			StateDir:          stateDir,
			Logger:            testLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		in.lims = append(in.lims, l)
	}
	return in
}

// load is what the load balancer saw.
type load struct {
	admitted, denied, errors atomic.Int64
	worst                    atomic.Int64 // slowest decision, ns
	mu                       sync.Mutex
	lat                      []time.Duration
}

// observe records one decision's latency.
func (ld *load) observe(took time.Duration) {
	for {
		w := ld.worst.Load()
		if int64(took) <= w || ld.worst.CompareAndSwap(w, int64(took)) {
			break
		}
	}
	ld.mu.Lock()
	ld.lat = append(ld.lat, took)
	ld.mu.Unlock()
}

// drive sends requests for key round-robin over the instances from
// `workers` goroutines, pausing `pause` between requests, until ctx ends.
func (in *instances) drive(ctx context.Context, p core.Policy, key string, workers int, pause time.Duration, ld *load) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				l := in.lims[next.Add(1)%int64(len(in.lims))]
				start := time.Now()
				r, err := l.Allow(context.Background(), p, key)
				took := time.Since(start)
				ld.observe(took)
				switch {
				case err != nil:
					ld.errors.Add(1)
				case r.Allowed:
					ld.admitted.Add(1)
				default:
					ld.denied.Add(1)
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
}

// bound is what policy p allows over a run of length d.
func bound(p core.Policy, d time.Duration) float64 {
	_, most := p.Algorithm().(driver.Quotaer).Bound(p, d)
	return most
}

// TestOutage kills Redis under load above the limit and brings it back,
// with its data (AOF) or empty: over the whole run the instances together
// admit at most 105% of the policy's bound and at least 85% of what one
// exact limiter admits from the start, no caller sees an error, and every
// instance goes open, reconciling, closed.
func TestOutage(t *testing.T) {
	// The replay's under-admission is bounded by the debt clamp (one
	// bucket), so a capacity small against the run keeps the bound tight.
	tb, _ := tokenbucket.Policy("tb", 10, 20)
	sw, _ := slidingwindow.Policy("sw", 20, time.Second)
	sc, _ := slidingcounter.Policy("sc", 20, time.Second)
	for _, tc := range []struct {
		backend string
		p       core.Policy
		aof     bool
	}{
		{"goredis", tb, true}, {"goredis", sw, true}, {"rueidis", tb, true}, {"rueidis", sw, true},
		{"goredis", tb, false}, {"rueidis", sw, false},
		{"goredis", sc, true}, {"rueidis", sc, true}, {"goredis", sc, false}, {"rueidis", sc, false},
	} {
		restart := "aof"
		if !tc.aof {
			restart = "empty"
		}
		t.Run(fmt.Sprintf("%s/%s/%s", tc.backend, tc.p.Algorithm().Name(), restart), func(t *testing.T) {
			t.Parallel()
			var opts []redistest.Option
			if tc.aof {
				opts = append(opts, redistest.WithAOF())
			}
			srv := redistest.Start(t, opts...)
			in := startInstances(t, tc.backend, srv.URL(), 4, "")
			time.Sleep(300 * time.Millisecond) // every instance has heartbeated: N = 4
			for i, l := range in.lims {
				if n := l.Status().Instances; n != 4 {
					t.Fatalf("instance %d counts %d live instances, want 4", i, n)
				}
			}

			ctx, cancel := killRun(t, srv)
			defer cancel()
			var ld load
			start := time.Now()
			in.drive(ctx, tc.p, "client-1", 4, 2*time.Millisecond, &ld)
			took := time.Since(start)
			b := bound(tc.p, took)
			ratio := float64(ld.admitted.Load()) / b
			// The floor is what one exact limiter admits from the start (for
			// the sliding window counter, whose estimate admits the limit and
			// then one unit less a window, well under its bound of a limit in
			// each fixed window the run overlaps).
			ideal, _ := tc.p.Algorithm().(driver.Quotaer).Bound(tc.p, took)
			floor := float64(ld.admitted.Load()) / ideal
			t.Logf("admitted %d denied %d errors %d in %v: bound %.0f, ratio %.3f, %.3f of the ideal %.0f, slowest decision %v",
				ld.admitted.Load(), ld.denied.Load(), ld.errors.Load(), took.Round(time.Millisecond), b, ratio, floor, ideal, time.Duration(ld.worst.Load()))
			record("kill -9 for 3 s, restart "+map[bool]string{true: "with AOF", false: "empty"}[tc.aof], tc.backend, tc.p, &ld, b)
			if ld.errors.Load() != 0 {
				t.Errorf("%d errors reached callers", ld.errors.Load())
			}
			if ratio > 1.05 || floor < 0.85 {
				t.Errorf("admitted/bound = %.3f, want at most 1.05; admitted/ideal = %.3f, want at least 0.85", ratio, floor)
			}
			in.checkRecovered(t)
		})
	}
}

// killRun returns the context of a run of 7.5 s in which Redis runs for
// 1.5 s, is killed (SIGKILL) for 3 s and is restarted.
func killRun(t *testing.T, srv *redistest.Server) (context.Context, context.CancelFunc) {
	const normal, outage, after = 1500 * time.Millisecond, 3 * time.Second, 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), normal+outage+after)
	go func() {
		time.Sleep(normal)
		srv.Kill()
		time.Sleep(outage)
		srv.Restart(t)
	}()
	return ctx, cancel
}

// checkRecovered asserts every instance went open, reconciling, closed and
// left nothing in its outage log.
func (in *instances) checkRecovered(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i, l := range in.lims {
		for l.Status().Breaker != "closed" || l.Status().PendingLog > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("instance %d not recovered: %+v", i, l.Status())
			}
			time.Sleep(20 * time.Millisecond)
		}
		in.mu.Lock()
		seen := fmt.Sprint(in.seen[i])
		in.mu.Unlock()
		if seen != "[open reconciling closed]" {
			t.Errorf("instance %d went through %s, want [open reconciling closed]", i, seen)
		}
	}
}

// TestBlackHole SIGSTOPs Redis under load: connections are accepted and
// never answered. No decision waits much past the call deadline, callers
// see no error, and the limit holds.
func TestBlackHole(t *testing.T) {
	t.Parallel()
	tb, _ := tokenbucket.Policy("tb", 10, 20)
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			in := startInstances(t, backend, srv.URL(), 4, "")
			time.Sleep(300 * time.Millisecond)
			const normal, outage, after = time.Second, 2 * time.Second, 2500 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), normal+outage+after)
			defer cancel()
			go func() {
				time.Sleep(normal)
				srv.Pause()
				time.Sleep(outage)
				srv.Resume()
			}()
			var ld load
			start := time.Now()
			in.drive(ctx, tb, "client-1", 4, 2*time.Millisecond, &ld)
			b := bound(tb, time.Since(start))
			worst := time.Duration(ld.worst.Load())
			record("SIGSTOP for 2 s (black hole)", backend, tb, &ld, b)
			t.Logf("admitted %d errors %d: ratio %.3f; slowest decision %v (call deadline %v)",
				ld.admitted.Load(), ld.errors.Load(), float64(ld.admitted.Load())/b, worst, callTimeout)
			if ld.errors.Load() != 0 {
				t.Errorf("%d errors reached callers", ld.errors.Load())
			}
			// A stall bound, not a speed figure: a black-holed Redis must not
			// hold a request past its deadline plus scheduling noise.
			if worst > callTimeout+400*time.Millisecond {
				t.Errorf("a decision took %v; the call deadline is %v", worst, callTimeout)
			}
			if r := float64(ld.admitted.Load()) / b; r > 1.05 || r < 0.85 {
				t.Errorf("admitted/bound = %.3f, want within [0.85, 1.05]", r)
			}
			in.checkRecovered(t)
		})
	}
}

// TestGentleClientNeverRejected sends half the token bucket's rate, spread
// over the instances, through a Redis kill and restart: not one rejection.
func TestGentleClientNeverRejected(t *testing.T) {
	t.Parallel()
	p, _ := tokenbucket.Policy("tb", 10, 20)
	srv := redistest.Start(t, redistest.WithAOF())
	in := startInstances(t, "goredis", srv.URL(), 4, "")
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	go func() {
		time.Sleep(time.Second)
		srv.Kill()
		time.Sleep(2 * time.Second)
		srv.Restart(t)
	}()
	var ld load
	in.drive(ctx, p, "gentle", 1, 100*time.Millisecond, &ld) // 10 a second, half the rate
	record("kill -9 for 2 s, client at half its rate", "goredis", p, &ld, 0)
	t.Logf("gentle client: admitted %d, denied %d, errors %d", ld.admitted.Load(), ld.denied.Load(), ld.errors.Load())
	if ld.denied.Load() != 0 || ld.errors.Load() != 0 || ld.admitted.Load() < 40 {
		t.Errorf("admitted %d denied %d errors %d: a client at half its limit must never be rejected",
			ld.admitted.Load(), ld.denied.Load(), ld.errors.Load())
	}
}

// TestFlapping kills and restarts Redis every 1-2 s for 12 s under load: no
// error reaches a caller and the bound holds.
func TestFlapping(t *testing.T) {
	t.Parallel()
	p, _ := tokenbucket.Policy("tb", 10, 20)
	srv := redistest.Start(t, redistest.WithAOF())
	in := startInstances(t, "rueidis", srv.URL(), 4, "")
	time.Sleep(300 * time.Millisecond)
	const run = 12 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	chaos := make(chan struct{})
	defer func() { <-chaos }()
	go func() {
		defer close(chaos)
		for i := 0; ctx.Err() == nil && i < 10; i++ {
			time.Sleep(time.Second + time.Duration(i%2)*500*time.Millisecond)
			srv.Kill()
			time.Sleep(time.Second)
			srv.Restart(t)
		}
	}()
	var ld load
	start := time.Now()
	in.drive(ctx, p, "flap", 4, 2*time.Millisecond, &ld)
	b := bound(p, time.Since(start))
	r := float64(ld.admitted.Load()) / b
	record("flapping: kill/restart every 1-2 s for 12 s", "rueidis", p, &ld, b)
	t.Logf("flapping: admitted %d denied %d errors %d, ratio %.3f", ld.admitted.Load(), ld.denied.Load(), ld.errors.Load(), r)
	if ld.errors.Load() != 0 {
		t.Errorf("%d errors reached callers", ld.errors.Load())
	}
	// Every switch between Redis and leases costs a little slack; a flap
	// each 1-2 s has measured 1.03-1.08 of the bound here. The assertion
	// is the documented flapping slack, not the steady-outage 1.05.
	if r > 1.10 || r < 0.85 {
		t.Errorf("admitted/bound = %.3f, want within [0.85, 1.10]", r)
	}
}

// TestStateDirKeepsUsageAcrossRestart: an instance stopped during an outage
// writes its outage log to its state dir; the instance started again with
// the same id replays it when Redis returns, so the usage is not lost.
func TestStateDirKeepsUsageAcrossRestart(t *testing.T) {
	t.Parallel()
	p, _ := tokenbucket.Policy("tb", 10, 0.001) // no refill to speak of
	srv := redistest.Start(t, redistest.WithAOF())
	dir := t.TempDir()
	first := startInstances(t, "goredis", srv.URL(), 1, dir)
	ctx := context.Background()
	if r, err := first.lims[0].AllowN(ctx, p, "k", 2); err != nil || !r.Allowed || r.Mode != core.ModeRedis {
		t.Fatalf("before the outage: %+v, %v", r, err)
	}
	srv.Kill()
	admitted := 0
	for range 20 {
		if r, err := first.lims[0].Allow(ctx, p, "k"); err == nil && r.Allowed {
			if !r.Degraded {
				t.Fatalf("admitted through a dead Redis: %+v", r)
			}
			admitted++
		}
	}
	if admitted != 8 {
		t.Fatalf("local lease admitted %d, want the 8 tokens left", admitted)
	}
	if err := first.lims[0].Close(); err != nil {
		t.Fatal(err)
	}
	saved, err := filepath.Glob(filepath.Join(dir, "*.journal"))
	if err != nil || len(saved) != 1 || filepath.Base(saved[0]) != "holdfast-app1.journal" {
		t.Fatalf("state dir holds journals %v (%v), want the one of app1", saved, err)
	}
	if n, err := fallback.JournalPending(dir, "app1"); err != nil || n == 0 {
		t.Fatalf("journal holds %d pending grants (%v), want the outage log", n, err)
	}
	srv.Restart(t)
	second := startInstances(t, "goredis", srv.URL(), 1, dir)
	deadline := time.Now().Add(5 * time.Second)
	for second.lims[0].Status().PendingLog > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("log not replayed: %+v", second.lims[0].Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r, err := second.lims[0].Allow(ctx, p, "k"); err != nil || r.Allowed || r.Mode != core.ModeRedis {
		t.Fatalf("after the restart: %+v, %v; want a Redis denial: the 10 tokens were spent", r, err)
	}
	for n, err := fallback.JournalPending(dir, "app1"); n > 0 || err != nil; n, err = fallback.JournalPending(dir, "app1") {
		if time.Now().After(deadline) {
			t.Fatalf("journal still holds %d pending grants (%v) after its log was replayed", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStartWhileRedisDown: an instance started with Redis down serves at
// once from leases with the configured instance count, joins when Redis
// appears, and its grants are in Redis afterwards.
func TestStartWhileRedisDown(t *testing.T) {
	t.Parallel()
	p, _ := tokenbucket.Policy("tb", 8, 0.001) // no refill to speak of
	srv := redistest.Start(t, redistest.WithAOF())
	srv.Kill()
	in := startInstances(t, "goredis", srv.URL(), 4, "") // ExpectedInstances: 4
	l := in.lims[0]
	if st := l.Status(); st.Breaker != "open" || st.Instances != 4 {
		t.Fatalf("status %+v, want open with the 4 expected instances", st)
	}
	ctx := context.Background()
	admitted := 0
	for range 5 {
		r, err := l.Allow(ctx, p, "k")
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
		if !r.Degraded || r.Mode != core.ModeLocal || r.Limit != 2 {
			t.Fatalf("result %+v, want a local decision on a share of 2", r)
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d before Redis existed, want the share 8/4 = 2", admitted)
	}
	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for st := l.Status(); st.Breaker != "closed" || st.PendingLog > 0; st = l.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("did not join: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Redis now holds 8 - 2 = 6 tokens.
	got := 0
	for range 10 {
		if r, err := l.Allow(ctx, p, "k"); err == nil && r.Allowed && r.Mode == core.ModeRedis {
			got++
		}
	}
	if got != 6 {
		t.Fatalf("Redis admitted %d after joining, want 6 (the 2 local grants were folded in)", got)
	}
}

// TestOutageModes: during an outage a fail_closed policy denies everything,
// a fail_open one admits everything and its usage is still folded back, so
// the key owes it afterwards.
func TestOutageModes(t *testing.T) {
	t.Parallel()
	closed, _ := tokenbucket.Policy("login", 5, 0.001)
	open, _ := tokenbucket.Policy("search", 5, 0.001)
	srv := redistest.Start(t, redistest.WithAOF())
	l, err := fallback.New(newStore(t, "goredis", srv.URL()), fallback.Options{
		ID: "modes", Heartbeat: 200 * time.Millisecond,
		Breaker:     fallback.BreakerOptions{CallTimeout: callTimeout, ProbeInterval: 200 * time.Millisecond},
		OutageModes: map[string]fallback.OutageMode{"login": fallback.FailClosed, "search": fallback.FailOpen},
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	srv.Kill()
	for i := range 8 {
		if r, err := l.Allow(ctx, closed, "u"); err != nil || r.Allowed || r.Mode != core.ModeFailClosed || !r.Degraded {
			t.Fatalf("fail_closed request %d: %+v, %v", i, r, err)
		}
		if r, err := l.Allow(ctx, open, "u"); err != nil || !r.Allowed || r.Mode != core.ModeFailOpen || !r.Degraded {
			t.Fatalf("fail_open request %d: %+v, %v", i, r, err)
		}
	}
	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for st := l.Status(); st.Breaker != "closed" || st.PendingLog > 0; st = l.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("not recovered: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 8 admitted against a capacity of 5: the key is in debt, nothing left.
	if r, err := l.Allow(ctx, open, "u"); err != nil || r.Allowed || r.Mode != core.ModeRedis {
		t.Fatalf("after fail_open usage was folded back: %+v, %v; want a Redis denial", r, err)
	}
	if r, err := l.Allow(ctx, closed, "u"); err != nil || !r.Allowed || r.Mode != core.ModeRedis {
		t.Fatalf("fail_closed key after recovery: %+v, %v; want its full quota", r, err)
	}
}

// testLogger discards the instances' logs unless HOLDFAST_TEST_LOG is set,
// when they go to stderr (breaker transitions, reconciliations).
func testLogger() *slog.Logger {
	if os.Getenv("HOLDFAST_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

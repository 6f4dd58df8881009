package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
)

func newStore(t testing.TB, srv *redistest.Server) driver.Store {
	c, err := goredis.NewClient(srv.URL(), goredis.ClientOptions{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return goredis.New(c)
}

// crashAfter applies every call on the store, then reports a failure for
// the first `fail` calls: a process that died after Redis applied a batch
// but before it cleared its log.
type crashAfter struct {
	driver.Store
	mu   sync.Mutex // guards fail: a replay sends its slices at once
	fail int
}

// crash reports whether this call's reply is lost, counting it.
func (c *crashAfter) crash() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail > 0 {
		c.fail--
		return true
	}
	return false
}

var errCrash = errors.New("injected crash after apply")

// RunCommands applies the commands, then reports the first `fail` calls'
// replies lost: each command an unanswered error.
func (c *crashAfter) RunCommands(ctx context.Context, cmds [][]string) []error {
	errs := c.Store.(driver.Commander).RunCommands(ctx, cmds)
	if c.crash() {
		for i := range errs {
			errs[i] = &core.StoreError{Class: core.ClassUnavailable, Reason: "crash", Err: errCrash}
		}
	}
	return errs
}

func (c *crashAfter) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	r, err := c.Store.Run(ctx, s, keys, args)
	if err == nil && s != driver.TimeScript && c.crash() {
		return nil, errCrash
	}
	return r, err
}

// bucket reads a token bucket key: the instant its credit was or will be
// zero (tokenbucket.State.Empty).
func bucket(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	e, err := tokenbucket.ParseStored(srv.Do(t, "GET", key))
	if err != nil {
		t.Fatalf("bucket %s: %v", key, err)
	}
	return e
}

// redisNow is the server's clock in microseconds.
func redisNow(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	var sec, us int64
	if _, err := fmt.Sscanf(srv.Do(t, "TIME"), "[%d %d]", &sec, &us); err != nil {
		t.Fatal(err)
	}
	return sec*1_000_000 + us
}

// TestCrashMidReconcileCountsOnce: a batch applied whose acknowledgement was
// lost is sent again with the same id, and Redis counts it once.
func TestCrashMidReconcileCountsOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			// In the fresh mode the fresh call applies the batch and the
			// replay script it goes to then acknowledges it by its marker:
			// both replies are lost.
			fail := 1
			if mode == "fresh" {
				fail = 2
			}
			store := &crashAfter{Store: newStore(t, srv), fail: fail}
			p, _ := tokenbucket.Policy("tb", 10, 1)
			now := time.Now().UnixMicro()
			key := driver.StorageKey("hf:", "tb", "crash")
			b := driver.Batch{ID: "app1:run:1", Key: key, Policy: p, Seed: driver.Seed{Value: 10e6, At: now},
				Grants: []driver.Grant{{Cost: 3, At: now}, {Cost: 2, At: now}}}
			r := newFor(mode, reconcile.Options{})
			if errs := reconcileIn(t, mode, r, store, []driver.Batch{b}); !errors.Is(errs[0], errCrash) {
				t.Fatalf("first attempt: %v, want the injected crash", errs[0])
			}
			for attempt := range 3 {
				if errs := reconcileIn(t, mode, r, store, []driver.Batch{b}); errs[0] != nil {
					t.Fatalf("retry %d: %v", attempt, errs[0])
				}
			}
			if got := tokenbucket.FromEmpty(bucket(t, srv, key), now, 10e6); got.Credit != 5e6 {
				t.Fatalf("bucket %+v, want 5 tokens (10 - 3 - 2) at %d: the batch counted once", got, now)
			}
		})
	}
}

// TestScriptMatchesModel: the replay script on Redis and tokenbucket.Replay
// agree on the stored bucket, with a stored state, with a seed, and with
// nothing.
func TestScriptMatchesModel(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			store := newStore(t, srv)
			p, _ := tokenbucket.Policy("tb", 10, 4) // 250 ms a token
			full := int64(10 * 250_000)
			now := time.Now().UnixMicro()
			grants := []driver.Grant{{Cost: 4, At: now - 900_000}, {Cost: 4, At: now - 800_000}, {Cost: 5, At: now - 100_000}, {Cost: 3, At: now}}
			for i, tc := range []struct {
				stored *tokenbucket.State
				legacy bool // stored as the hash {c, t} of earlier versions
				seed   driver.Seed
			}{
				{stored: &tokenbucket.State{Credit: 1_000_000, Last: now - 1_000_000}},
				{stored: &tokenbucket.State{Credit: 0, Last: now - 500_000}}, // newer than some grants
				{stored: &tokenbucket.State{Credit: 0, Last: now - 500_000}, legacy: true},
				{seed: driver.Seed{Value: 500_000, At: now - 2_000_000}},
				{},
			} {
				key := driver.StorageKey("hf:", "tb", fmt.Sprint("model-", i))
				var st int64
				switch {
				case tc.legacy:
					st = tc.stored.Empty()
					srv.Do(t, "HSET", key, "c", fmt.Sprint(tc.stored.Credit), "t", fmt.Sprint(tc.stored.Last))
				case tc.stored != nil:
					st = tc.stored.Empty()
					srv.Do(t, "SET", key, fmt.Sprint(st))
				}
				b := driver.Batch{ID: fmt.Sprint("app1:e1:", i), Key: key, Policy: p, Seed: tc.seed, Grants: grants}
				before := redisNow(t, srv)
				if errs := reconcileIn(t, mode, newFor(mode, reconcile.Options{}), store, []driver.Batch{b}); errs[0] != nil {
					t.Fatal(errs[0])
				}
				after := redisNow(t, srv)
				// The script bounds the debt at its own Redis time, between before
				// and after: the model at both brackets it.
				lo := tokenbucket.Replay(st, tc.stored != nil, tc.seed, &tokenbucket.MergeLog{}, 10, 250_000, before, grants)
				hi := tokenbucket.Replay(st, tc.stored != nil, tc.seed, &tokenbucket.MergeLog{}, 10, 250_000, after, grants)
				got := bucket(t, srv, key)
				if got < lo || got > hi {
					t.Errorf("case %d: Redis %d, model %d..%d", i, got, lo, hi)
				}
				if c := tokenbucket.FromEmpty(got, after, full).Credit; c < -full || c > full {
					t.Errorf("case %d: credit %d outside ±one bucket", i, c)
				}
			}
		})
	}
}

// TestScriptMergesInstances: three instances' batches for one key, replayed
// through Redis one after another, leave the bucket where the Go model (one
// global bucket fed all grants) does.
func TestScriptMergesInstances(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			store := newStore(t, srv)
			p, _ := tokenbucket.Policy("tb", 10, 10) // 100 ms a token
			now := time.Now().UnixMicro()
			key := driver.StorageKey("hf:", "tb", "merge")
			start := tokenbucket.State{Credit: 2 * 100_000, Last: now - 3_000_000}
			srv.Do(t, "SET", key, fmt.Sprint(start.Empty()))
			var m tokenbucket.MergeLog
			want := start.Empty()
			r := newFor(mode, reconcile.Options{})
			for i := range 3 {
				var grants []driver.Grant
				for j := range 10 {
					// Each instance admits 2.5 a second, interleaved with the others.
					grants = append(grants, driver.Grant{Cost: 1, At: now - 3_000_000 + int64(j)*400_000 + int64(i)*133_000})
				}
				b := driver.Batch{ID: fmt.Sprint("app", i, ":e1:1"), Key: key, Policy: p, Grants: grants}
				if errs := reconcileIn(t, mode, r, store, []driver.Batch{b}); errs[0] != nil {
					t.Fatal(errs[0])
				}
				// No debt reaches a bucket here, so the replay's own time does not
				// matter to the model.
				want = tokenbucket.Replay(want, true, driver.Seed{}, &m, 10, 100_000, now, grants)
				if got := bucket(t, srv, key); got != want {
					t.Fatalf("after instance %d: Redis %d, model %d", i, got, want)
				}
			}
			// 30 grants over 3 s at 10 a second of refill, from 2 tokens: one global
			// bucket never fills, so it ends at 2 + 26.x - 30 tokens, not in a debt
			// of a whole bucket as charging the later instances without refill would.
			if c := tokenbucket.FromEmpty(want, now, 10*100_000).Credit; c < -2*100_000 {
				t.Fatalf("credit %d: the merge charged more than one global bucket", c)
			}
		})
	}
}

// TestMergeEnds: a merge log is read only in its window and until a
// decision through Redis writes the key: a batch after either is charged
// against the stored bucket alone, as the first of a new merge.
func TestMergeEnds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := tokenbucket.Policy("tb", 10, 10) // 100 ms a token
	l, _ := core.NewLimiter(store, core.Options{Prefix: "hf:"})
	for _, end := range []string{"window", "decision"} {
		t.Run(end, func(t *testing.T) {
			r := reconcile.New(reconcile.Options{MergeWindow: 200 * time.Millisecond})
			now := redisNow(t, srv)
			key := driver.StorageKey("hf:", "tb", "ends-"+end)
			// The bucket is not full again for half a second: its key
			// outlives the window.
			first := []driver.Grant{{Cost: 8, At: now - 300_000}}
			second := []driver.Grant{{Cost: 1, At: now - 290_000}}
			if errs := r.Reconcile(context.Background(), store, []driver.Batch{{ID: "app1-" + end + ":e1:1", Key: key, Policy: p, Grants: first}}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			if v := srv.Do(t, "GET", key); !strings.Contains(v, "|") {
				t.Fatalf("after the first batch the key holds %q, no merge log", v)
			}
			cur := bucket(t, srv, key)
			if end == "window" {
				time.Sleep(300 * time.Millisecond)
			} else {
				if res, err := l.Allow(context.Background(), p, "ends-"+end); err != nil || !res.Allowed {
					t.Fatalf("decision: %+v %v", res, err)
				}
				if v := srv.Do(t, "GET", key); strings.Contains(v, "|") {
					t.Fatalf("after a decision the key holds %q, still a merge log", v)
				}
				cur = bucket(t, srv, key)
			}
			if errs := r.Reconcile(context.Background(), store, []driver.Batch{{ID: "app2-" + end + ":e1:1", Key: key, Policy: p, Grants: second}}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			var fresh tokenbucket.MergeLog
			want := tokenbucket.Replay(cur, true, driver.Seed{}, &fresh, 10, 100_000, now, second)
			if got := bucket(t, srv, key); got != want {
				t.Fatalf("Redis %d, model of a new merge %d", got, want)
			}
		})
	}
}

// TestSlidingWindowReplay: grants land at their original times, a replay of
// the same grants under another batch id adds nothing (request ids), grants
// outside the window are skipped, and an empty key is seeded.
func TestSlidingWindowReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			store := newStore(t, srv)
			p, _ := slidingwindow.Policy("sw", 10, 10*time.Second)
			now := time.Now().UnixMicro()
			key := driver.StorageKey("hf:", "sw", "replay")
			grants := []driver.Grant{
				{ID: "old", Cost: 1, At: now - 20_000_000}, // outside the window
				{ID: "a", Cost: 1, At: now - 5_000_000},
				{ID: "b", Cost: 3, At: now - 1_000_000},
			}
			seed := driver.Seed{Value: 2, At: now - 3_000_000}
			r := newFor(mode, reconcile.Options{})
			for _, id := range []string{"app1:e1:1", "app1:e1:1", "app1:e1:2"} {
				b := driver.Batch{ID: id, Key: key, Policy: p, Seed: seed, Grants: grants}
				if errs := reconcileIn(t, mode, r, store, []driver.Batch{b}); errs[0] != nil {
					t.Fatal(errs[0])
				}
			}
			// 2 seeded (the key was missing) + a + b, b#1, b#2.
			if n := srv.Do(t, "ZCARD", key); n != "6" {
				t.Fatalf("ZCARD = %s, want 6", n)
			}
			if s, _ := strconv.ParseFloat(srv.Do(t, "ZSCORE", key, "b#2"), 64); int64(s) != now-1_000_000 {
				t.Fatalf("b#2 scored %v, want its original time %d", s, now-1_000_000)
			}
			// The decision script now sees 6 of 10 used.
			l, _ := core.NewLimiter(store, core.Options{})
			res, err := l.AllowN(context.Background(), p, "replay", 5)
			if err != nil || res.Allowed || res.Remaining != 4 {
				t.Fatalf("after replay: %+v, %v; want a denial with 4 remaining", res, err)
			}
		})
	}
}

// BenchmarkReconcile replays the outage log of N keys, one batch of three
// grants per key, into an EMPTY Redis through each backend's pipelines: the
// workload of the harness's section 4 (bench/harness/reconcile.go), which a
// recovery after Redis restarted empty sends. Each iteration flushes the
// server and builds its batches with the timer stopped; only Reconcile is
// timed. Keys or batch ids reused across iterations would measure something
// else: a batch applied before is a no-op (one EXISTS), and a key whose merge
// log is still open merges against a growing log. redis-µs/key is Redis's
// CPU time (INFO cpu) per key: the replay is Redis-bound when it is close to
// ns/op / N. failed/op counts batches whose first attempt failed (sent
// again, as the fallback layer does; the time includes that). Each size
// runs with one batch a call and with DefaultMultiBatches a call (batches
// of one hash slot together).
func BenchmarkReconcile(b *testing.B) {
	for _, backend := range []string{"goredis", "rueidis"} {
		b.Run(backend, func(b *testing.B) { benchReconcile(b, backend) })
	}
}

func benchReconcile(b *testing.B, backend string) {
	srv := redistest.Start(b)
	var store driver.Store
	if backend == "goredis" {
		// The default client, as the harness and the fallback layer use
		// it: a 50 ms read deadline per pipeline.
		c, err := goredis.NewClient(srv.URL(), goredis.ClientOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		store = goredis.New(c)
	} else {
		c, err := hfrueidis.NewClient(srv.URL(), hfrueidis.ClientOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		store = hfrueidis.New(c)
	}
	tb, _ := tokenbucket.Policy("rtb", 100, 10)
	sw, _ := slidingwindow.Policy("rsw", 100, time.Minute)
	sc, _ := slidingcounter.Policy("rsc", 100, time.Minute)
	for _, p := range []core.Policy{tb, sw, sc} {
		for _, n := range []int{1_000, 10_000, 100_000} {
			for _, per := range []int{1, reconcile.DefaultMultiBatches} {
				b.Run(fmt.Sprint(p.Algorithm().Name(), "/", n, "_keys/", per, "_per_call"), func(b *testing.B) {
					r := reconcile.New(reconcile.Options{MultiBatches: per})
					var redisCPU time.Duration
					var failed int
					for range b.N {
						b.StopTimer()
						srv.Do(b, "FLUSHALL", "SYNC")
						batches := reconcileBatches(p, "bench-", n, time.Now().UnixMicro())
						cpu0 := serverCPU(b, srv)
						b.StartTimer()
						// As the fallback layer (and the harness) do, batches
						// that failed, an unknown outcome, are sent again with
						// the same ids.
						for attempt := 0; len(batches) > 0; attempt++ {
							var again []driver.Batch
							var last error
							for i, err := range r.Reconcile(context.Background(), store, batches) {
								if err != nil {
									again, last = append(again, batches[i]), err
								}
							}
							if attempt == 0 {
								failed += len(again)
							}
							if len(again) > 0 && attempt == 4 {
								b.Fatalf("%d batches still failing: %v", len(again), last)
							}
							batches = again
						}
						b.StopTimer()
						redisCPU += serverCPU(b, srv) - cpu0
						b.StartTimer()
					}
					b.ReportMetric(float64(redisCPU.Microseconds())/float64(b.N*n), "redis-µs/key")
					b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
				})
			}
		}
	}
}

// reconcileBatches is the outage log of n keys under policy p: one batch per
// key, with three grants of cost 1 a millisecond apart before now, the
// same as the harness's section 4 builds.
func reconcileBatches(p core.Policy, id string, n int, now int64) []driver.Batch {
	const grants = 3
	batches := make([]driver.Batch, n)
	for k := range batches {
		ks := strconv.Itoa(k)
		gs := make([]driver.Grant, grants)
		for j := range gs {
			gs[j] = driver.Grant{ID: id + ks + "-" + strconv.Itoa(j), Cost: 1, At: now - int64(grants-j)*1000}
		}
		batches[k] = driver.Batch{ID: id + "app:e1:" + ks, Key: driver.StorageKey("hf:", p.Name(), "k"+ks), Policy: p, Grants: gs}
	}
	return batches
}

// serverCPU is the server's user + system CPU time (INFO cpu).
func serverCPU(t testing.TB, srv *redistest.Server) time.Duration {
	t.Helper()
	var total float64
	for _, line := range strings.Split(srv.Do(t, "INFO", "cpu"), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("INFO cpu %s: %v", line, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// TestScriptIsModelProperty: for random buckets (stored, seeded or
// missing) and random batches of one to three instances replayed one
// after another, in calls of their own or beside another batch, Redis ends
// where tokenbucket.Replay, one global bucket fed every grant, does: the
// first batch through replay.lua's precomputed path or, into a missing
// key, through a fresh call (FreshWrites), the later ones through its
// merge log.
func TestScriptIsModelProperty(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		capacity := rapid.Int64Range(1, 20).Draw(rt, "capacity")
		perSecond := rapid.SampledFrom([]float64{1, 4, 10, 100}).Draw(rt, "perSecond")
		p, err := tokenbucket.Policy("tb", capacity, perSecond)
		if err != nil {
			rt.Fatal(err)
		}
		tok := p.Interval().Microseconds()
		full := capacity * tok
		now := redisNow(t, srv)
		key := driver.StorageKey("hf:", "tb", fmt.Sprint("prop-", n))
		cur, ok := int64(0), false
		var seed driver.Seed
		switch rapid.IntRange(0, 2).Draw(rt, "start") {
		case 0:
			cur, ok = now-rapid.Int64Range(0, 2*full).Draw(rt, "credit"), true
			srv.Do(t, "SET", key, fmt.Sprint(cur), "PX", "60000")
		case 1:
			seed = driver.Seed{Value: rapid.Int64Range(0, full).Draw(rt, "seedCredit"), At: now - rapid.Int64Range(1, 3_000_000).Draw(rt, "seedAge")}
		}
		// Through fresh calls first (the first batch of a missing key
		// written by the client's arithmetic), or the replay script alone.
		freshMin := -1
		if rapid.Bool().Draw(rt, "fresh") {
			freshMin = 1
		}
		r := reconcile.New(reconcile.Options{MergeWindow: time.Minute, FreshMin: freshMin})
		var m tokenbucket.MergeLog
		want := cur
		instances := rapid.IntRange(1, 3).Draw(rt, "instances")
		for i := range instances {
			var grants []driver.Grant
			for range rapid.IntRange(1, 6).Draw(rt, "grants") {
				grants = append(grants, driver.Grant{Cost: rapid.Int64Range(1, capacity).Draw(rt, "cost"),
					At: now - rapid.Int64Range(0, 5_000_000).Draw(rt, "age")})
			}
			b := driver.Batch{ID: fmt.Sprint("prop", n, "-", i, ":e1:1"), Key: key, Policy: p, Seed: seed, Grants: grants}
			batches := []driver.Batch{b}
			if rapid.Bool().Draw(rt, "beside") {
				other := b
				other.ID, other.Key = fmt.Sprint("prop", n, "-", i, ":e1:2"), key+":beside"
				batches = append(batches, other)
			}
			before := redisNow(t, srv)
			for j, err := range r.Reconcile(context.Background(), store, batches) {
				if err != nil {
					rt.Fatalf("instance %d batch %d: %v", i, j, err)
				}
			}
			after := redisNow(t, srv)
			mlo, mhi := m, m
			mlo.Grants, mhi.Grants = slices.Clone(m.Grants), slices.Clone(m.Grants)
			lo := tokenbucket.Replay(want, ok, seed, &mlo, capacity, tok, before, grants)
			hi := tokenbucket.Replay(want, ok, seed, &mhi, capacity, tok, after, grants)
			got := bucket(t, srv, key)
			if got < lo || got > hi {
				rt.Fatalf("instance %d: Redis %d, model %d..%d", i, got, lo, hi)
			}
			m, want, ok = mhi, got, true
		}
	})
}

// TestMarkerOf: one instance's run of sequence numbers shares a hash named
// under the key's prefix, as do the restores of one data epoch; on Cluster
// the hash is in the key's slot.
func TestMarkerOf(t *testing.T) {
	key := driver.StorageKey("hf:", "tb", "k")
	for _, tc := range []struct {
		key, id     string
		cluster     bool
		hash, field string
	}{
		{key, "app1:p7:5", false, "hf:rb:app1:p7:0", "5"},
		{key, "app1:p7:4096", false, "hf:rb:app1:p7:1", "4096"},
		{"x:" + key, "app1:p7:5", false, "x:hf:rb:app1:p7:0", "5"},
		{key, "batch-1", false, "hf:rb:batch-1", "-"},
		{key, "app1:p7:5", true, "hf:{" + driver.SlotTag(driver.HashSlot(key)) + "}:rb:app1:p7:0", "5"},
		// The restores of one data epoch share a hash; the key is the field.
		{key, reconcile.RestoreID(1700000000123456, key), false, "hf:rb:restore:1700000000123456", key},
		{key, reconcile.RestoreID(1700000000123456, key), true, "hf:{" + driver.SlotTag(driver.HashSlot(key)) + "}:rb:restore:1700000000123456", key},
		{key, "restore:x", false, "hf:rb:restore:x", "-"},
	} {
		hash, field := reconcile.MarkerOf(tc.key, tc.id, tc.cluster)
		if hash != tc.hash || field != tc.field {
			t.Errorf("MarkerOf(%q, %q, %v) = %q %q, want %q %q", tc.key, tc.id, tc.cluster, hash, field, tc.hash, tc.field)
		}
		if tc.cluster && driver.HashSlot(hash) != driver.HashSlot(tc.key) {
			t.Errorf("%q: slot %d, key's %d", hash, driver.HashSlot(hash), driver.HashSlot(tc.key))
		}
	}
}

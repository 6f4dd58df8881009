package slidingcounter_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

func newStore(t testing.TB, srv *redistest.Server) *goredis.Store {
	t.Helper()
	c, err := goredis.NewClient(srv.URL(), goredis.ClientOptions{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return goredis.New(c)
}

// stored reads a counter key as a State; ok is false when there is none.
func stored(t testing.TB, srv *redistest.Server, key string) (slidingcounter.State, bool) {
	t.Helper()
	v := srv.Do(t, "GET", key)
	if v == "" {
		return slidingcounter.State{}, false
	}
	var s slidingcounter.State
	if _, err := fmt.Sscanf(v, "%d:%d:%d", &s.Window, &s.Cur, &s.Prev); err != nil {
		t.Fatalf("key %s holds %q: %v", key, v, err)
	}
	return s, true
}

func put(t testing.TB, srv *redistest.Server, key string, s slidingcounter.State) {
	t.Helper()
	srv.Do(t, "SET", key, fmt.Sprintf("%d:%d:%d", s.Window, s.Cur, s.Prev), "PX", "600000")
}

// TestRedisMatchesTwin: on any stored state — counts above the limit (as a
// replay may leave them), a window behind or ahead of now, the largest
// numbers a policy allows (Limit × Window = MaxProduct, counts of 2^21 at
// 2^30 µs windows) — the script and Decide give the same reply and leave
// the same state.
func TestRedisMatchesTwin(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	var i int
	rapid.Check(t, func(rt *rapid.T) {
		i++
		var lim, w int64
		if rapid.Bool().Draw(rt, "largest") {
			lim, w = 1<<20, 1<<30
		} else {
			lim = rapid.Int64Range(1, 1000).Draw(rt, "limit")
			w = rapid.Int64Range(1, 10_000_000).Draw(rt, "window_us")
		}
		p := must(driver.NewPolicy("sc", slidingcounter.Algorithm, lim, time.Duration(w)*time.Microsecond))
		now := storetest.T0 + rapid.Int64Range(0, 1<<40).Draw(rt, "now")
		key := driver.StorageKey("hf:", "sc", fmt.Sprint("twin-", i))
		var st slidingcounter.State
		ok := rapid.Bool().Draw(rt, "stored")
		if ok {
			st = slidingcounter.State{
				Window: now/w + rapid.Int64Range(-3, 2).Draw(rt, "window_offset"),
				Cur:    rapid.Int64Range(0, 2*lim+5).Draw(rt, "cur"),
				Prev:   rapid.Int64Range(0, 2*lim+5).Draw(rt, "prev"),
			}
			put(t, srv, key, st)
		}
		cost := rapid.Int64Range(1, lim).Draw(rt, "cost")
		got := storetest.Decide(rt, store, p, key, cost, now)
		next, changed, r := slidingcounter.Decide(st, ok, now, lim, w, cost)
		if want, _ := driver.ParseReply(r[:]); got != want {
			rt.Fatalf("state %+v (%v): Redis %+v, twin %+v", st, ok, got, want)
		}
		if !changed {
			next = st
		}
		if changed && r[3] < 1_000_000 {
			return // the key may have expired already, in real time
		}
		if s, held := stored(t, srv, key); s != next || held != (ok || changed) {
			rt.Fatalf("Redis holds %+v (%v), twin %+v", s, held, next)
		}
	})
}

// TestRedisKeyLifetime: an admission leaves the key living until the end of
// the next window, at most twice the window; a denial writes nothing.
func TestRedisKeyLifetime(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p := must(slidingcounter.Policy("sc", 2, time.Hour))
	key := driver.StorageKey("hf:", "sc", "ttl")
	// 10 minutes into an hour: the key lives 110 minutes, to the ms.
	now := (storetest.T0/3_600_000_000)*3_600_000_000 + 600_000_000
	if r := storetest.Decide(t, store, p, key, 2, now); !r.Allowed || r.ResetAfter != 6_600_000_000 {
		t.Fatalf("first decision %+v", r)
	}
	pttl, err := strconv.ParseInt(srv.Do(t, "PTTL", key), 10, 64)
	if err != nil || pttl > 6_600_001 || pttl < 6_600_001-5_000 {
		t.Fatalf("PTTL %d (%v), want 6600001 ms less the test's own time", pttl, err)
	}
	srv.Do(t, "PEXPIRE", key, "100000")
	if r := storetest.Decide(t, store, p, key, 1, now); r.Allowed {
		t.Fatalf("second decision %+v", r)
	}
	if pttl, err := strconv.ParseInt(srv.Do(t, "PTTL", key), 10, 64); err != nil || pttl > 100_000 || pttl < 95_000 {
		t.Fatalf("after a denial PTTL %d (%v), want the 100000 ms set before less the test's own time", pttl, err)
	}
}

// TestRedisBadState: another type is ErrWrongType; a string that is not a
// counter is a script error naming the key, and nothing is written.
func TestRedisBadState(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p := must(slidingcounter.Policy("sc", 3, time.Second))
	ctx := context.Background()
	args := p.Algorithm().Args(p, 1, "", 0)
	list := driver.StorageKey("hf:", "sc", "list")
	srv.Do(t, "RPUSH", list, "x")
	if _, err := store.Run(ctx, p.Algorithm().Script(), []string{list}, args); !errors.Is(err, core.ErrWrongType) {
		t.Fatalf("list: %v, want ErrWrongType", err)
	}
	for _, v := range []string{"12", "1:2", "a:1:2", "1:2:3:4", "-1:2:3"} {
		key := driver.StorageKey("hf:", "sc", "bad")
		srv.Do(t, "SET", key, v)
		_, err := store.Run(ctx, p.Algorithm().Script(), []string{key}, args)
		if err == nil || errors.Is(err, core.ErrWrongType) || !strings.Contains(err.Error(), "corrupt state in "+key) {
			t.Errorf("state %q: %v, want a corrupt state error", v, err)
		}
		if got := srv.Do(t, "GET", key); got != v {
			t.Errorf("state %q: rewritten as %q", v, got)
		}
	}
}

// TestRedisMemoryPerKey: a counter key costs at most 104 B in Redis
// (MEMORY USAGE) for any limit up to 10^6 a window of a second, and at most
// 120 B for the largest numbers; the token bucket's key and the sliding
// window's sorted sets are measured beside it. Keys are the benchmark's
// layout, hf:{sc:k000000}, one decision each (the sorted sets: as many as
// their units); the used_memory growth per key is logged.
func TestRedisMemoryPerKey(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	const n = 10_000
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		policy core.Policy
		cost   int64
		units  int // decisions on each key
		max    int // MEMORY USAGE bound, B; 0: logged only
	}{
		{"counter 100 per minute", must(slidingcounter.Policy("sc", 100, time.Minute)), 1, 1, 88},
		{"counter 10^6 per second", must(slidingcounter.Policy("sc", 1_000_000, time.Second)), 999_999, 1, 104},
		{"counter largest", must(driver.NewPolicy("sc", slidingcounter.Algorithm, 1<<20, 1<<30*time.Microsecond)), 1 << 20, 1, 104},
		// The longest string a key may hold: a 1 µs window's index, the
		// largest limit and a replay's twice that. Written, not decided
		// (a 1 µs window's key lives 1 ms).
		{"counter longest string", must(driver.NewPolicy("sc", slidingcounter.Algorithm, core.MaxLimit, time.Microsecond)), 0, 1, 120},
		{"token bucket", must(tokenbucket.Policy("tb", 100, 0.01)), 1, 1, 0},
		{"sliding window 3 units", must(slidingwindow.Policy("sw", 100, time.Minute)), 1, 3, 0},
		{"sliding window 100 units", must(slidingwindow.Policy("sw", 100, time.Minute)), 1, 100, 0},
		{"sliding window 200 units", must(slidingwindow.Policy("sw", 200, time.Minute)), 1, 200, 0},
	} {
		srv.Do(t, "FLUSHALL")
		keys := n
		if tc.units > 1 {
			keys = 100
		}
		before := usedMemory(t, srv)
		p := tc.policy
		calls := make([]driver.Call, 0, 10_000)
		flush := func() {
			for _, r := range store.RunMany(ctx, calls) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			calls = calls[:0]
		}
		for i := range keys {
			key := driver.StorageKey("hf:", p.Name(), fmt.Sprintf("k%06d", i))
			if tc.cost == 0 {
				srv.Do(t, "SET", key, fmt.Sprintf("%d:%d:%d", storetest.T0, core.MaxLimit, 2*core.MaxLimit), "PX", "600000")
				continue
			}
			for u := range tc.units {
				calls = append(calls, driver.Call{Script: p.Algorithm().Script(), Keys: []string{key}, Args: p.Algorithm().Args(p, tc.cost, driver.NewRequestID(), 0)})
				if len(calls) == cap(calls) || u == tc.units-1 && i == keys-1 {
					flush()
				}
			}
		}
		delta := float64(usedMemory(t, srv)-before) / float64(keys)
		worst := 0
		for i := 0; i < keys; i += max(keys/100, 1) {
			usage, err := strconv.Atoi(srv.Do(t, "MEMORY", "USAGE", driver.StorageKey("hf:", p.Name(), fmt.Sprintf("k%06d", i)), "SAMPLES", "0"))
			if err != nil {
				t.Fatal(err)
			}
			worst = max(worst, usage)
		}
		first := driver.StorageKey("hf:", p.Name(), "k000000")
		t.Logf("%s: %d keys, MEMORY USAGE at most %d B (%s, encoding %s), used_memory delta %.1f B per key",
			tc.name, keys, worst, srv.Do(t, "TYPE", first), srv.Do(t, "OBJECT", "ENCODING", first), delta)
		if tc.max > 0 && worst > tc.max {
			t.Errorf("%s: MEMORY USAGE %d B per key, want at most %d", tc.name, worst, tc.max)
		}
	}
}

func usedMemory(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	for line := range strings.SplitSeq(srv.Do(t, "INFO", "memory"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}

// BenchmarkRedisDecide is one decision through the decision script on a
// redis-server of its own, through go-redis, beside the token bucket's and
// the sliding window's: one hot key, and 100k keys in turn. The policies
// never run dry, so every call writes. redis-µs/call is Redis's own time
// per script call (INFO commandstats, EVALSHA): what the script costs the
// server, apart from the round trip that dominates ns/op.
//
//	go test -run '^$' -bench RedisDecide ./algorithms/slidingcounter
func BenchmarkRedisDecide(b *testing.B) {
	srv := redistest.Start(b)
	store := newStore(b, srv)
	l, err := core.NewLimiter(store, core.Options{})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	for _, p := range []core.Policy{
		must(slidingcounter.Policy("bsc", core.MaxLimit, time.Second)),
		must(tokenbucket.Policy("btb", 1_000_000, 1_000_000)),
		must(slidingwindow.Policy("bsw", slidingwindow.MaxLimit, 100*time.Millisecond)),
	} {
		for _, bc := range []struct {
			name string
			keys []string
		}{{"hot_key", keys[:1]}, {"100k_keys", keys}} {
			b.Run(p.Algorithm().Name()+"/"+bc.name, func(b *testing.B) {
				ctx := context.Background()
				var next atomic.Int64
				srv.Do(b, "CONFIG", "RESETSTAT")
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := l.Allow(ctx, p, bc.keys[int(next.Add(1))%len(bc.keys)]); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(evalshaMicros(b, srv), "redis-µs/call")
			})
		}
	}
}

// evalshaMicros is Redis's mean time per EVALSHA since the last
// CONFIG RESETSTAT.
func evalshaMicros(b *testing.B, srv *redistest.Server) float64 {
	for line := range strings.SplitSeq(srv.Do(b, "INFO", "commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			for f := range strings.SplitSeq(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					x, err := strconv.ParseFloat(v, 64)
					if err != nil {
						b.Fatal(err)
					}
					return x
				}
			}
		}
	}
	return 0
}

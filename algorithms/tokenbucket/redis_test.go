package tokenbucket_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestRedisMemoryPerKey: a token bucket key costs at most 100 bytes in
// Redis (MEMORY USAGE): the state is one integer, which Redis keeps
// INT-encoded in the object header. The keys are the benchmark's layout,
// hf:{tb:k000000}, one decision each; the used_memory growth per key, which
// also counts the expiry entry and both dictionaries' tables, is logged.
func TestRedisMemoryPerKey(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		policy core.Policy
		cost   int64
	}{
		// The benchmark's policy: a key lives 100 s after one decision.
		{"bench", must(tokenbucket.Policy("tb", 100, 0.01)), 1},
		// Credit near MaxCredit: the largest integers the state holds.
		{"max_credit", must(driver.NewPolicy("tbmax", tokenbucket.Algorithm, 3_000_000, 375*time.Second)), 1},
	} {
		srv.Do(t, "FLUSHALL")
		before := usedMemory(t, srv)
		p := tc.policy
		args := p.Algorithm().Args(p, tc.cost, "", 0)
		calls := make([]driver.Call, 0, 10_000)
		for i := 0; i < n; i += cap(calls) {
			calls = calls[:0]
			for j := i; j < min(n, i+cap(calls)); j++ {
				calls = append(calls, driver.Call{Script: p.Algorithm().Script(), Keys: []string{driver.StorageKey("hf:", "tb", fmt.Sprintf("k%06d", j))}, Args: args})
			}
			for _, r := range store.RunMany(ctx, calls) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
		}
		delta := float64(usedMemory(t, srv)-before) / float64(n)
		worst := 0
		for i := 0; i < n; i += n / 100 {
			key := driver.StorageKey("hf:", "tb", fmt.Sprintf("k%06d", i))
			usage, err := strconv.Atoi(srv.Do(t, "MEMORY", "USAGE", key, "SAMPLES", "0"))
			if err != nil {
				t.Fatal(err)
			}
			worst = max(worst, usage)
		}
		enc := srv.Do(t, "OBJECT", "ENCODING", driver.StorageKey("hf:", "tb", "k000000"))
		t.Logf("%s: %d keys, MEMORY USAGE at most %d B (encoding %s), used_memory delta %.1f B per key", tc.name, n, worst, enc, delta)
		if worst > 100 {
			t.Errorf("%s: MEMORY USAGE %d B per key, want at most 100", tc.name, worst)
		}
		if enc != "int" {
			t.Errorf("%s: encoding %q, want int", tc.name, enc)
		}
	}
}

func must(p core.Policy, err error) core.Policy {
	if err != nil {
		panic(err)
	}
	return p
}

// TestRedisLegacyHash: a key still holding the hash {c, t} an earlier
// holdfast wrote is read as that bucket; a denial leaves it, an admission
// rewrites it as the one-integer string. Another type is ErrWrongType, a
// string that is not an integer a plain script error.
func TestRedisLegacyHash(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p := must(tokenbucket.Policy("tb", 10, 1)) // 1 s a token
	const t0 = storetest.T0
	key := driver.StorageKey("hf:", "tb", "legacy")
	// Three tokens at t0.
	srv.Do(t, "HSET", key, "c", "3000000", "t", strconv.FormatInt(t0, 10))
	st := tokenbucket.State{Credit: 3_000_000, Last: t0}
	for i, step := range []struct {
		at   int64
		cost int64
	}{{500_000, 4}, {500_000, 3}, {700_000, 1}} {
		got := storetest.Decide(t, store, p, key, step.cost, t0+step.at)
		next, changed, want := tokenbucket.Decide(st, true, t0+step.at, 10, 1_000_000, step.cost)
		if changed {
			st = next
		}
		if w, _ := driver.ParseReply(want[:]); got != w {
			t.Fatalf("step %d: Redis %+v, twin %+v", i, got, w)
		}
		typ := srv.Do(t, "TYPE", key)
		if wantTyp := map[bool]string{false: "hash", true: "string"}[i > 0]; typ != wantTyp {
			t.Fatalf("step %d: key type %s, want %s", i, typ, wantTyp)
		}
	}
	if e := srv.Do(t, "GET", key); e != strconv.FormatInt(st.Empty(), 10) {
		t.Fatalf("stored %s, want %d", e, st.Empty())
	}

	list := driver.StorageKey("hf:", "tb", "list")
	srv.Do(t, "RPUSH", list, "x")
	args := p.Algorithm().Args(p, 1, "", 0)
	if _, err := store.Run(context.Background(), p.Algorithm().Script(), []string{list}, args); !errors.Is(err, core.ErrWrongType) {
		t.Fatalf("list key: %v, want ErrWrongType", err)
	}
	corrupt := driver.StorageKey("hf:", "tb", "corrupt")
	srv.Do(t, "SET", corrupt, "12:34")
	_, err := store.Run(context.Background(), p.Algorithm().Script(), []string{corrupt}, args)
	if err == nil || !strings.Contains(err.Error(), "corrupt state") || errors.Is(err, core.ErrWrongType) {
		t.Fatalf("corrupt key: %v, want a corrupt-state error", err)
	}
}

// TestRedisExpiry: after every admitted decision the bucket's key lives at
// least until the bucket is full again (reset_after from the decision's
// Redis time) and at most a quarter of full longer, whether the decision
// wrote the key whole (a fresh key, one without an expiry) or moved E in
// place (spends in a row, which leave an expiry that is long enough as it
// is); the value stays E alone, INT-encoded, and a denial leaves the key
// and its expiry as they were.
func TestRedisExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	ctx := context.Background()
	p := must(tokenbucket.Policy("exp", 10, 10)) // full: 1 s
	const full = 1_000_000
	const held = 50_000 // us a script may be held between TIME and PEXPIRE
	key := driver.StorageKey("hf:", "tb", "exp")
	decide := func(what string, cost int64) (r []int64, expiresAt int64) {
		t.Helper()
		r, err := store.Run(ctx, p.Algorithm().Script(), []string{key}, p.Algorithm().Args(p, cost, "", 0))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if expiresAt, err = strconv.ParseInt(srv.Do(t, "PEXPIRETIME", key), 10, 64); err != nil {
			t.Fatal(err)
		}
		return r, expiresAt
	}
	spend := func(what string) (now, expiresAt int64) {
		t.Helper()
		r, at := decide(what, 1)
		if r[0] != 1 {
			t.Fatalf("%s: denied (reply %v), want admitted", what, r)
		}
		now, reset := r[4], r[3]
		if e, err := strconv.ParseInt(srv.Do(t, "GET", key), 10, 64); err != nil || e != now-full+reset {
			t.Fatalf("%s: E %d (%v), want now - full + reset_after = %d", what, e, err, now-full+reset)
		}
		if enc := srv.Do(t, "OBJECT", "ENCODING", key); enc != "int" {
			t.Fatalf("%s: encoding %s, want int", what, enc)
		}
		// PEXPIRE counts from Redis's clock as it runs, later than the
		// script's TIME by as long as the script was held: on a loaded
		// machine Redis is descheduled for milliseconds. The expiry may
		// be later by that much (a longer life is safe), never earlier.
		if at*1000 < now+reset || at*1000 > now+reset+full/4+3000+held {
			t.Fatalf("%s: expires at %d ms, want from %d to %d (reset_after %d us)", what, at, (now+reset)/1000, (now+reset+full/4+3000+held)/1000, reset)
		}
		return now, at
	}
	now1, at1 := spend("fresh key")
	now2, at2 := spend("second spend")
	if now2-now1 < 100_000 && at2 != at1 {
		// Spend 1 set the expiry 350 ms past now1; spend 2 needs 200 ms.
		t.Errorf("second spend %d us after the first moved the expiry from %d to %d ms, want it kept", now2-now1, at1, at2)
	}
	for i := range 7 {
		spend(fmt.Sprintf("spend %d in a row", i+3))
	}
	srv.Do(t, "PERSIST", key)
	_, at := spend("key without an expiry")
	// All 10 tokens spent: a decision of cost 10 is denied (for about a
	// second) and writes nothing.
	value := srv.Do(t, "GET", key)
	r, atAfter := decide("cost 10", 10)
	if r[4]-now1 >= 900_000 {
		t.Logf("cost 10 decided %d us after the first spend: the bucket may have refilled, denial not checked", r[4]-now1)
		return
	}
	if r[0] != 0 {
		t.Fatalf("cost 10 after 10 spends: reply %v, want a denial", r)
	}
	if atAfter != at || srv.Do(t, "GET", key) != value {
		t.Fatalf("a denial changed the key: expiry %d -> %d ms, value %s -> %s", at, atAfter, value, srv.Do(t, "GET", key))
	}
}

package tokenbucket_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

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

// TestScriptIsTwinProperty: one decision of the script, on Redis, at a
// given now (ARGV[4]), replies what the Go twin decides, stores the E of
// the twin's next state, and gives the key the expiry of the state it
// stores: kept (SET KEEPTTL) when the key held E alone in the quarter of
// the new E, else to the end of the new E's quarter plus full, and 2 ms
// (lifeMs). Capacities, refill times and costs span their whole range,
// where the script's integer divisions (by q, by T, by 1000) must stay
// exact in Lua's doubles; buckets start missing, full, partly spent or
// in debt.
func TestScriptIsTwinProperty(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	ctx := context.Background()
	var n int
	rapid.Check(t, func(rt *rapid.T) {
		n++
		key := driver.StorageKey("hf:", "twin", strconv.Itoa(n))
		tu := rapid.SampledFrom([]int64{1, 7, 1000, 3003, 999_983, 1_000_000_000}).Draw(rt, "T")
		c := rapid.Int64Range(1, min(tokenbucket.MaxCredit/tu, 1<<40)).Draw(rt, "C")
		cost := rapid.Int64Range(1, c).Draw(rt, "cost")
		now := int64(1_700_000_000_000_000) + rapid.Int64Range(0, 1<<40).Draw(rt, "now")
		full := c * tu
		var st tokenbucket.State
		var seeded bool
		var e, ttl int64
		if rapid.Bool().Draw(rt, "seeded") {
			// E from a bucket full long ago to a debt of a full bucket.
			e = now - 2*full + rapid.Int64Range(0, 3*full).Draw(rt, "E")
			ttl = rapid.Int64Range(10_000, 1_000_000).Draw(rt, "ttl_ms")
			srv.Do(t, "SET", key, strconv.FormatInt(e, 10), "PX", strconv.FormatInt(ttl, 10))
			st, seeded = tokenbucket.FromEmpty(e, now, full), true
		}
		r, err := store.Run(ctx, tokenbucket.Algorithm.Script(), []string{key}, []string{
			strconv.FormatInt(c, 10), strconv.FormatInt(tu, 10), strconv.FormatInt(cost, 10), strconv.FormatInt(now, 10)})
		if err != nil {
			rt.Fatal(err)
		}
		pttl, err := strconv.ParseInt(srv.Do(t, "PTTL", key), 10, 64)
		if err != nil {
			rt.Fatal(err)
		}
		next, changed, want := tokenbucket.Decide(st, seeded, now, c, tu, cost)
		if fmt.Sprint(r) != fmt.Sprint(want[:]) {
			rt.Fatalf("reply %v, twin %v", r, want)
		}
		// kept: the seeded expiry, less the milliseconds since.
		kept := func(what string) {
			if pttl > ttl || pttl < ttl-1000 {
				rt.Fatalf("%s moved the expiry: %d ms left of %d", what, pttl, ttl)
			}
		}
		if !changed {
			if seeded {
				kept("a denial")
			}
			return
		}
		ne := next.Empty()
		bq, q := tokenbucket.Quarter(ne, full)
		life := tokenbucket.LifeMs(ne, full, now)
		got := srv.Do(t, "GET", key)
		if got == "" && life < 100 && !(seeded && e >= bq) {
			return // a bucket full within milliseconds, expired already
		}
		if got != strconv.FormatInt(ne, 10) {
			rt.Fatalf("stored %q, want E %d", got, ne)
		}
		if seeded && e >= bq {
			// E alone, in the quarter of the new E: its expiry kept.
			kept("a spend in E's quarter")
			return
		}
		if pttl > life || pttl < life-1000 {
			rt.Fatalf("expires in %d ms, want %d (E %d, quarter %d, full %d)", pttl, life, ne, q, full)
		}
	})
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
// Redis time) and at most a quarter of full longer: until the end of E's
// quarter, (⌊E/q⌋+1)·q + full, q = full/4, and 1–2 ms more. A spend that
// leaves E in the quarter of the E the key held keeps its expiry (SET
// KEEPTTL), any other writes it again; so a key without an expiry (after
// a PERSIST) gets one at the first spend that leaves its quarter. The
// value stays E alone, INT-encoded, and a denial leaves the key and its
// expiry as they were.
func TestRedisExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	ctx := context.Background()
	p := must(tokenbucket.Policy("exp", 10, 10)) // full: 1 s, a token 100 ms
	const full, q = 1_000_000, 250_000
	const held = 50_000 // us a script may be held between TIME and SET PX
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
	// spend admits one token and returns the E it stored and the key's
	// expiry (-1: none).
	spend := func(what string) (e, expiresAt int64) {
		t.Helper()
		r, at := decide(what, 1)
		if r[0] != 1 {
			t.Fatalf("%s: denied (reply %v), want admitted", what, r)
		}
		now, reset := r[4], r[3]
		e, err := strconv.ParseInt(srv.Do(t, "GET", key), 10, 64)
		if err != nil || e != now-full+reset {
			t.Fatalf("%s: E %d (%v), want now - full + reset_after = %d", what, e, err, now-full+reset)
		}
		if enc := srv.Do(t, "OBJECT", "ENCODING", key); enc != "int" {
			t.Fatalf("%s: encoding %s, want int", what, enc)
		}
		return e, at
	}
	// inBounds: an expiry that covers E's quarter, at most 3 ms (and as
	// long as a script may be held: PX counts from Redis's clock as the
	// SET runs) past it.
	inBounds := func(what string, e, at int64) {
		t.Helper()
		end := (e/q+1)*q + full
		if at*1000 < end || at*1000 > end+3000+held {
			t.Fatalf("%s: expires at %d ms, want from %d to %d (E %d, its quarter ends at %d us)", what, at, end/1000, (end+3000+held)/1000, e, end)
		}
	}
	e1, at1 := spend("fresh key")
	inBounds("fresh key", e1, at1)
	e2, at2 := spend("second spend")
	inBounds("second spend", e2, at2)
	if e2/q == e1/q && at2 != at1 {
		t.Errorf("second spend in E's quarter moved the expiry from %d to %d ms, want it kept", at1, at2)
	}
	srv.Do(t, "PERSIST", key)
	prev, expiring := e2, false
	for i := range 8 {
		what := fmt.Sprintf("spend %d in a row, after a PERSIST", i+3)
		e, at := spend(what)
		if e/q != prev/q {
			expiring = true
		}
		if !expiring && at != -1 {
			t.Fatalf("%s: E %d in the quarter of the last, expires at %d ms, want no expiry kept", what, e, at)
		}
		if expiring {
			inBounds(what, e, at)
		}
		prev = e
	}
	if !expiring {
		t.Fatalf("8 spends of 100 ms from E %d left E in its quarter (last %d)", e2, prev)
	}
	// All 10 tokens spent: a decision of cost 10 is denied (for about a
	// second) and writes nothing.
	value, at := srv.Do(t, "GET", key), srv.Do(t, "PEXPIRETIME", key)
	r, atAfter := decide("cost 10", 10)
	now1 := e1 + full - 100_000 // the fresh key's spend left 9 tokens
	if r[4]-now1 >= 900_000 {
		t.Logf("cost 10 decided %d us after the first spend: the bucket may have refilled, denial not checked", r[4]-now1)
		return
	}
	if r[0] != 0 {
		t.Fatalf("cost 10 after 10 spends: reply %v, want a denial", r)
	}
	if strconv.FormatInt(atAfter, 10) != at || srv.Do(t, "GET", key) != value {
		t.Fatalf("a denial changed the key: expiry %s -> %d ms, value %s -> %s", at, atAfter, value, srv.Do(t, "GET", key))
	}
	// A refund of 3 tokens moves E back by 300 ms and writes the key with
	// its quarter's expiry, so that spends after it may keep it.
	c := p.Algorithm().(driver.Refunder).RefundCall(p, key, 3, "", driver.Reply{})
	if r, err := store.Run(ctx, c.Script, c.Keys, c.Args); err != nil || r[0] != 1 {
		t.Fatalf("refund: %v %v, want {1}", r, err)
	}
	e, err := strconv.ParseInt(srv.Do(t, "GET", key), 10, 64)
	if err != nil || e != prev-300_000 {
		t.Fatalf("refund: E %d (%v), want %d", e, err, prev-300_000)
	}
	at2, _ = strconv.ParseInt(srv.Do(t, "PEXPIRETIME", key), 10, 64)
	inBounds("refund", e, at2)
	// Two decisions of one token in one call (the Many's
	// write): E moves on by 200 ms, keeping the expiry in its quarter and
	// writing its quarter's otherwise.
	m := p.Algorithm().Script().Many()
	shared := p.Algorithm().Args(p, 1, "", 0)[:m.Shared]
	if r, err := store.Run(ctx, m.Script, []string{key}, append(shared, "1", "", "1", "")); err != nil {
		t.Fatalf("many: %v %v", r, err)
	}
	em, err := strconv.ParseInt(srv.Do(t, "GET", key), 10, 64)
	if err != nil || em != e+200_000 {
		t.Fatalf("many: E %d (%v), want %d", em, err, e+200_000)
	}
	atm, _ := strconv.ParseInt(srv.Do(t, "PEXPIRETIME", key), 10, 64)
	inBounds("many", em, atm)
	if em/q == e/q && atm != at2 {
		t.Errorf("many: E in the refund's quarter moved the expiry from %d to %d ms, want it kept", at2, atm)
	}
}

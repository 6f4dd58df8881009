package reconcile_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
)

// TestFreshMatchesScript: a batch written into a missing key by a fresh
// call (FreshWrites, the client's arithmetic) leaves the key as the replay
// script leaves it: the same bucket, base and merge-log grants, its log
// started and its TTL within the replay's own time; the same window
// members and scores, and a TTL no shorter; the same counts, read at the
// script's window (the fresh call's earlier now may keep them a window
// before it), and a TTL past the end of the window after them. Random
// policies, seeds and grants, debts past a full bucket included.
func TestFreshMatchesScript(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		kind := rapid.IntRange(0, 2).Draw(rt, "algorithm")
		window, counter := kind == 1, kind == 2
		capacity := rapid.Int64Range(1, 20).Draw(rt, "capacity")
		var p core.Policy
		var err error
		switch {
		case window:
			p, err = slidingwindow.Policy("fsw", capacity, time.Duration(rapid.Int64Range(1, 20).Draw(rt, "seconds"))*time.Second)
		case counter:
			// Short windows too, so that the fresh call and the script
			// often run in windows of their own.
			p, err = slidingcounter.Policy("fsc", capacity, rapid.SampledFrom([]time.Duration{20 * time.Millisecond, 200 * time.Millisecond, time.Second, 10 * time.Second}).Draw(rt, "window"))
		default:
			p, err = tokenbucket.Policy("ftb", capacity, rapid.SampledFrom([]float64{0.5, 1, 4, 10}).Draw(rt, "perSecond"))
		}
		if err != nil {
			rt.Fatal(err)
		}
		width := p.Interval().Microseconds()
		now := redisNow(t, srv)
		batch := func(way string) driver.Batch {
			return driver.Batch{ID: fmt.Sprintf("%s%d:e:1", way, n), Key: driver.StorageKey("hf:", p.Name(), fmt.Sprint(way, n)), Policy: p}
		}
		b := batch("s")
		if rapid.Bool().Draw(rt, "seeded") {
			b.Seed = driver.Seed{Value: rapid.Int64Range(0, capacity*width).Draw(rt, "seedValue"), At: now - rapid.Int64Range(1, 3*width).Draw(rt, "seedAge")}
			if window || counter {
				b.Seed.Value = rapid.Int64Range(0, capacity).Draw(rt, "seedUnits")
			}
		}
		for g := range rapid.IntRange(1, 8).Draw(rt, "grants") {
			b.Grants = append(b.Grants, driver.Grant{ID: fmt.Sprint("g", n, "-", g), Cost: rapid.Int64Range(1, 3*capacity).Draw(rt, "cost"),
				At: now - rapid.Int64Range(0, 2*width).Draw(rt, "age")})
		}
		f := batch("f")
		f.Seed, f.Grants = b.Seed, b.Grants
		// The fresh call first: its now is then no later than the
		// script's.
		var before, after [2]int64 // fresh, script
		for i, way := range []struct {
			b        driver.Batch
			freshMin int
		}{{f, 1}, {b, -1}} {
			rec := &recording{Store: store}
			before[i] = redisNow(t, srv)
			if errs := reconcile.New(reconcile.Options{FreshMin: way.freshMin}).Reconcile(context.Background(), rec, []driver.Batch{way.b}); errs[0] != nil {
				rt.Fatal(errs[0])
			}
			after[i] = redisNow(t, srv)
			// The fresh way sends no replay script: a fresh call, or
			// for a window without seed units plain writes (none when
			// no unit is in the window); the script way one script.
			script := p.Algorithm().(driver.Replayer).ReplayScript().Name()
			if got, want := rec.count(script), max(-way.freshMin, 0); got != want {
				rt.Fatalf("%s: %d replay script calls, want %d", way.b.ID, got, want)
			}
			seeded := b.Seed.Value > 0 && b.Seed.At > before[i]-width+100_000
			unseeded := b.Seed.Value == 0 || b.Seed.At < before[i]-width-100_000
			if way.freshMin > 0 && window && unseeded && rec.count(driver.FreshScript.Name()) != 0 {
				rt.Fatalf("%s: a fresh call for a window batch without seed units", way.b.ID)
			}
			if way.freshMin > 0 && (!window || seeded) && rec.count(driver.FreshScript.Name()) != 1 || rec.plain > 0 && !window {
				rt.Fatalf("%s: %d fresh calls and %d plain writes", way.b.ID, rec.count(driver.FreshScript.Name()), rec.plain)
			}
		}
		pttl := func(key string) int64 {
			ms, err := strconv.ParseInt(srv.Do(t, "PTTL", key), 10, 64)
			if err != nil {
				rt.Fatal(err)
			}
			return ms
		}
		if counter {
			// Both keys, Redis's clock and the Unix time (ms) the fresh
			// key expires at (PEXPIRETIME, on the clock of TIME) in one
			// script, which sees them at one time: a key of a short
			// window may have expired since, the other not yet.
			read := strings.Fields(srv.Do(t, "EVAL", `local t = redis.call('TIME')
return (redis.call('GET', KEYS[1]) or '-') .. ' ' .. (redis.call('GET', KEYS[2]) or '-') .. ' ' .. t[1] .. ' ' .. t[2] .. ' ' .. redis.call('PEXPIRETIME', KEYS[1])`, "2", f.Key, b.Key))
			if len(read) != 5 {
				rt.Fatalf("read %q", read)
			}
			sec, _ := strconv.ParseInt(read[2], 10, 64)
			usec, _ := strconv.ParseInt(read[3], 10, 64)
			at := sec*1_000_000 + usec
			state := func(v string) (slidingcounter.State, bool) {
				var s slidingcounter.State
				if v == "-" {
					return s, false
				}
				if _, err := fmt.Sscanf(v, "%d:%d:%d", &s.Window, &s.Cur, &s.Prev); err != nil {
					rt.Fatalf("counter holds %q: %v", v, err)
				}
				return s, true
			}
			fs, fok := state(read[0])
			ss, sok := state(read[1])
			// Both as of the read (a missing key counts nothing), or of
			// the script's window when that is later (a clock ahead).
			j := max(at/width, ss.Window)
			if got, want := fs.Roll(j), ss.Roll(j); got != want {
				rt.Fatalf("fresh counter %+v (exists %v), the script's %+v (exists %v): %+v and %+v at window %d", fs, fok, ss, sok, got, want, j)
			}
			if expires, _ := strconv.ParseInt(read[4], 10, 64); fok && expires*1000 < (fs.Window+2)*width-1000 {
				rt.Fatalf("fresh counter of window %d expires at %d ms, before the end %d µs of the window after it", fs.Window, expires, (fs.Window+2)*width)
			}
			return
		}
		if window {
			// Members with their scores; one that the script skipped as
			// outside the window may be kept by the earlier now of the
			// fresh call, and is outside the window at the next decision.
			members := func(key, seed string) map[string]string {
				m := map[string]string{}
				if srv.Do(t, "EXISTS", key) == "0" {
					return m
				}
				kv := strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(srv.Do(t, "ZRANGE", key, "0", "-1", "WITHSCORES")))
				for i := 0; i+1 < len(kv); i += 2 {
					m[strings.Replace(kv[i], seed, "seed:", 1)] = kv[i+1]
				}
				return m
			}
			fm, sm := members(f.Key, "seed:"+f.ID), members(b.Key, "seed:"+b.ID)
			for id, score := range sm {
				if fm[id] != score {
					rt.Fatalf("script member %s at %s, the fresh key's at %q", id, score, fm[id])
				}
			}
			for id, score := range fm {
				at, _ := strconv.ParseInt(score, 10, 64)
				if _, ok := sm[id]; !ok && at > before[1]-width {
					rt.Fatalf("fresh member %s at %s inside the script's window (%d)", id, score, before[1]-width)
				}
			}
			if len(sm) > 0 && pttl(f.Key) < pttl(b.Key)-2-(after[1]-before[0])/1000 {
				rt.Fatalf("fresh PTTL %d, the script's %d", pttl(f.Key), pttl(b.Key))
			}
			return
		}
		// The bucket is the model's at a time within the fresh call's
		// replay; its value holds the script's base and grants.
		full := capacity * width
		model := func(now int64) int64 {
			return tokenbucket.Replay(0, false, b.Seed, &tokenbucket.MergeLog{}, capacity, width, now, b.Grants)
		}
		sv, fv := strings.Split(srv.Do(t, "GET", b.Key), "|"), strings.Split(srv.Do(t, "GET", f.Key), "|")
		fe, _ := strconv.ParseInt(fv[0], 10, 64)
		if lo, hi := model(before[0]), model(after[0]); fe < lo || fe > hi {
			rt.Fatalf("fresh bucket %d, the model's %d..%d", fe, lo, hi)
		}
		if len(sv) != len(fv) || len(sv) > 1 && strings.Join(sv[2:], "|") != strings.Join(fv[2:], "|") {
			rt.Fatalf("fresh value %q, the script's %q", fv, sv)
		}
		keep := int64(0)
		if len(sv) > 1 {
			keep = time.Second.Milliseconds() + 1 // the default merge window
			if s, _ := strconv.ParseInt(fv[1], 10, 64); s < before[0] || s > after[0] {
				rt.Fatalf("fresh merge log started at %d, outside its replay %d..%d", s, before[0], after[0])
			}
		}
		// Its TTL: until the bucket is full again, at least while the log
		// is read; read after the replay. E alone lives to the end of its
		// quarter (tokenbucket.lua's expiry), up to a quarter of full more.
		got := pttl(f.Key)
		read := redisNow(t, srv)
		until := fe + full
		if len(fv) == 1 {
			q := max(full/4, 1000)
			until = (fe/q+1)*q + full
		}
		lo, hi := max((fe+full-read)/1000, keep-(read-before[0])/1000)-2, max((until-before[0])/1000+2, keep)+1
		if got < lo || got > hi {
			rt.Fatalf("fresh PTTL %d, want %d..%d", got, lo, hi)
		}
	})
}

// TestFreshMixed: a fresh replay of batches whose keys are missing, exist,
// repeat, or were applied before acknowledges each batch once and leaves
// every key as the replay scripts alone do; a retry through either way
// adds nothing.
func TestFreshMixed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	for _, p := range smallPolicies("m") {
		now := redisNow(t, srv)
		build := func(way string) []driver.Batch {
			var bs []driver.Batch
			for i, k := range []string{"k1", "k2", "k1", "k3", "k4", "k2", "k5"} {
				id := fmt.Sprintf("%s%s:e:%d", way, p.Name(), i)
				bs = append(bs, driver.Batch{ID: id, Key: driver.StorageKey("hf:", p.Name(), way+k), Policy: p,
					Grants: []driver.Grant{{ID: id + "-a", Cost: int64(1 + i%3), At: now - 3000}, {ID: id + "-b", Cost: 1, At: now - 1000}}})
			}
			return bs
		}
		scripts, fresh := build("s:"), build("f:")
		// k3 exists before the replay, and batch 4 (k4) was applied
		// before: in both ways.
		for _, bs := range [][]driver.Batch{scripts, fresh} {
			prior := reconcile.New(reconcile.Options{FreshMin: -1}).Reconcile(context.Background(), store, []driver.Batch{bs[3], bs[4]})
			if prior[0] != nil || prior[1] != nil {
				t.Fatalf("%s: prior replay %v", p.Name(), prior)
			}
		}
		// The batch of k3 replayed now is another batch of the same key.
		for _, bs := range [][]driver.Batch{scripts, fresh} {
			bs[3].ID += "0"
		}
		for attempt := range 2 {
			for way, r := range map[string]*reconcile.Reconciler{
				"scripts": reconcile.New(reconcile.Options{FreshMin: -1}),
				"fresh":   reconcile.New(reconcile.Options{FreshMin: 1}),
			} {
				bs := scripts
				if way == "fresh" {
					bs = fresh
				}
				if attempt == 1 {
					// The retry goes the other way.
					r = reconcile.New(reconcile.Options{FreshMin: map[string]int{"scripts": 1, "fresh": -1}[way]})
				}
				rec := &recording{Store: store}
				for i, err := range r.Reconcile(context.Background(), rec, bs) {
					if err != nil {
						t.Fatalf("%s %s attempt %d batch %d: %v", p.Name(), way, attempt, i, err)
					}
				}
			}
			for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
				got := state(t, srv, p, driver.StorageKey("hf:", p.Name(), "f:"+k))
				want := state(t, srv, p, driver.StorageKey("hf:", p.Name(), "s:"+k))
				if got != want {
					t.Errorf("%s attempt %d key %s: fresh %q, scripts %q", p.Name(), attempt, k, got, want)
				}
			}
		}
	}
}

// TestFreshStopsOnExistingKeys: a replay into a Redis that kept its keys
// (a partition) stops sending fresh calls once a slice found most keys
// there; every batch goes to the replay script and counts once, as in a
// replay through the scripts alone.
func TestFreshStopsOnExistingKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	// A bucket that refills in 100 s: its keys outlive the test's
	// replays, however slow (under -race on a busy machine).
	p, _ := tokenbucket.Policy("xtb", 10, 0.1)
	const n = 8 * 1024
	now := redisNow(t, srv)
	scripts := reconcile.New(reconcile.Options{FreshMin: -1, CallTimeout: 10 * time.Second})
	before := reconcileBatches(p, "before-", n, now)
	for _, err := range scripts.Reconcile(context.Background(), store, before) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The same keys, and a reference set replayed the same way through
	// the scripts alone.
	ref := reconcileBatches(p, "ref-before-", n, now)
	for i := range ref {
		ref[i].Key = "ref:" + ref[i].Key
	}
	for _, err := range scripts.Reconcile(context.Background(), store, ref) {
		if err != nil {
			t.Fatal(err)
		}
	}
	rec := &recording{Store: store}
	multi := pipelining{recording: rec, pl: store.(driver.Pipeliner)}
	again := reconcileBatches(p, "again-", n, now)
	for _, err := range reconcile.New(reconcile.Options{CallTimeout: 10 * time.Second}).Reconcile(context.Background(), multi, again) {
		if err != nil {
			t.Fatal(err)
		}
	}
	refAgain := reconcileBatches(p, "ref-again-", n, now)
	for i := range refAgain {
		refAgain[i].Key = "ref:" + refAgain[i].Key
	}
	for _, err := range scripts.Reconcile(context.Background(), store, refAgain) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// At most the slices in flight when the first one's replies came
	// back were sent fresh: 4 of 1024 batches each, and the one built then.
	if rec.fresh == 0 || rec.fresh > 5*1024 {
		t.Errorf("%d of %d batches sent in fresh calls, want some and at most %d", rec.fresh, n, 5*1024)
	}
	for _, k := range []int{0, 1023, 1024, 4096, n - 1} {
		if got, want := state(t, srv, p, again[k].Key), state(t, srv, p, refAgain[k].Key); got != want {
			t.Errorf("key %d: %s, the scripts' %s", k, got, want)
		}
	}
}

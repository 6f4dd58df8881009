package slidingcounter_test

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
	"github.com/holdfast/holdfast/storetest"
)

// TestReplayModel: grants count in the window of their original time —
// the current one, the one before, or none — a seed only on a missing
// key, counts stop at twice the limit, and a batch that counts nothing
// leaves the key as it was.
func TestReplayModel(t *testing.T) {
	const lim, w = 10, 1_000_000
	now := storetest.T0 + 500_000
	k := now / w
	g := func(at, cost int64) driver.Grant { return driver.Grant{Cost: cost, At: storetest.T0 + at} }
	// 2 now, 4 a window ago, 5 two windows ago.
	grants := []driver.Grant{g(100_000, 2), g(-500_000, 4), g(-1_500_000, 5)}
	seed := driver.Seed{Value: 5, At: storetest.T0 - 200_000}
	for _, tc := range []struct {
		name   string
		cur    slidingcounter.State
		ok     bool
		seed   driver.Seed
		grants []driver.Grant
		want   slidingcounter.State
		added  int64
	}{
		{"same_window", slidingcounter.State{Window: k, Cur: 2, Prev: 3}, true, seed, grants, slidingcounter.State{Window: k, Cur: 4, Prev: 7}, 6},
		{"window_before", slidingcounter.State{Window: k - 1, Cur: 3, Prev: 9}, true, seed, grants, slidingcounter.State{Window: k, Cur: 2, Prev: 7}, 6},
		{"missing_seeded", slidingcounter.State{}, false, seed, grants, slidingcounter.State{Window: k, Cur: 2, Prev: 9}, 11},
		{"missing_old_seed", slidingcounter.State{}, false, driver.Seed{Value: 5, At: storetest.T0 - 2_000_000}, grants, slidingcounter.State{Window: k, Cur: 2, Prev: 4}, 6},
		{"missing_no_seed", slidingcounter.State{}, false, driver.Seed{}, grants, slidingcounter.State{Window: k, Cur: 2, Prev: 4}, 6},
		{"capped", slidingcounter.State{Window: k, Cur: 9, Prev: 19}, true, driver.Seed{}, []driver.Grant{g(0, 10), g(1, 5), g(-1, 3)}, slidingcounter.State{Window: k, Cur: 20, Prev: 20}, 18},
		{"future_grant_counts_now", slidingcounter.State{}, false, driver.Seed{}, []driver.Grant{g(2_000_000, 1)}, slidingcounter.State{Window: k, Cur: 1}, 1},
		{"stored_window_ahead", slidingcounter.State{Window: k + 1, Cur: 1}, true, driver.Seed{}, grants, slidingcounter.State{Window: k + 1, Cur: 1, Prev: 2}, 2},
		{"nothing_counted", slidingcounter.State{Window: k - 3, Cur: 1, Prev: 1}, true, driver.Seed{}, []driver.Grant{g(-1_500_000, 5)}, slidingcounter.State{Window: k - 3, Cur: 1, Prev: 1}, 0},
	} {
		next, added := slidingcounter.Replay(tc.cur, tc.ok, tc.seed, lim, w, now, tc.grants)
		if next != tc.want || added != tc.added {
			t.Errorf("%s: Replay = %+v, %d; want %+v, %d", tc.name, next, added, tc.want, tc.added)
		}
	}
}

// TestReplayArgs: the policy's limit and window shared, then the seed and
// the grants' times and costs; reconcile adds the key and the marker.
func TestReplayArgs(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, 2*time.Second))
	b := driver.Batch{ID: "i1:e1:1", Key: "hf:{sc:k}", Policy: p, Seed: driver.Seed{Value: 3, At: 77},
		Grants: []driver.Grant{{ID: "a", Cost: 2, At: 100}, {ID: "b", Cost: 1, At: 101}}}
	rp := p.Algorithm().(driver.Replayer)
	o := driver.ReplayOptions{MergeWindow: time.Second}
	if args := rp.ReplayArgs(nil, &b, o); rp.ReplayScript() != slidingcounter.ReplayScript ||
		!reflect.DeepEqual(args, []string{"3", "77", "100", "2", "101", "1"}) {
		t.Fatalf("script %s, args %q", rp.ReplayScript().Name(), args)
	}
	if shared := rp.ReplaySharedArgs(nil, p, o); !reflect.DeepEqual(shared, []string{"10", "2000000"}) {
		t.Fatalf("shared args %q", shared)
	}
	c, err := reconcile.New(reconcile.Options{}).Call(&b, false)
	if err != nil || c.Script.Guarded() || !reflect.DeepEqual(c.Keys, []string{"hf:rb:i1:e1:0", "hf:{sc:k}"}) ||
		!reflect.DeepEqual(c.Args, []string{"1", "86400000", "1", "2", "10", "2000000", "1", "6", "3", "77", "100", "2", "101", "1"}) {
		t.Fatalf("call %q %q (%v)", c.Keys, c.Args, err)
	}
}

// TestOutdatedAndCoalesces: a grant is outdated once its window is older
// than the one before now's, exactly when the replay skips it; grants
// coalesce.
func TestOutdatedAndCoalesces(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	rp := p.Algorithm().(driver.Replayer)
	now := storetest.T0 + 500_000
	for _, tc := range []struct {
		at   int64
		want bool
	}{{storetest.T0 - 1_000_001, true}, {storetest.T0 - 1_000_000, false}, {storetest.T0 - 1, false}, {now, false}} {
		if got := rp.Outdated(p, tc.at, now); got != tc.want {
			t.Errorf("Outdated(%+d µs) = %v, want %v", tc.at-storetest.T0, got, tc.want)
		}
		_, added := slidingcounter.Replay(slidingcounter.State{}, false, driver.Seed{}, 10, 1_000_000, now, []driver.Grant{{Cost: 1, At: tc.at}})
		if (added == 0) != tc.want {
			t.Errorf("grant at %+d µs: replay counted %d, Outdated %v", tc.at-storetest.T0, added, tc.want)
		}
	}
	if !rp.Coalesces() {
		t.Error("Coalesces = false")
	}
}

// TestRedisReplay: on Redis, replay.lua leaves the key in the state the Go
// model gives (at the script's own Redis time, between two readings of
// TIME around it) and replies with the units it counted; the same batch
// sent again counts nothing; a decision afterwards sees the replayed
// counts; the key lives until the end of the next window.
func TestRedisReplay(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	const lim, w = 10, 10_000_000
	p := must(slidingcounter.Policy("sc", lim, w*time.Microsecond))
	ctx := context.Background()
	for i, tc := range []struct {
		name   string
		stored int64 // stored window, relative to now's; 99: none
		seed   int64 // seed time relative to now (0: no seed)
	}{
		{"same_window", 0, 0},
		{"window_before", -1, 0},
		{"old_key", -3, 0},
		{"missing_seeded", 99, -1},
		{"missing_unseeded", 99, 0},
		{"stored_beats_seed", 0, -1},
	} {
		key := driver.StorageKey("hf:", "sc", fmt.Sprint("replay-", i))
		now := redisNow(t, srv)
		var cur slidingcounter.State
		ok := tc.stored != 99
		if ok {
			cur = slidingcounter.State{Window: now/w + tc.stored, Cur: 3, Prev: 4}
			put(t, srv, key, cur)
		}
		var seed driver.Seed
		if tc.seed != 0 {
			seed = driver.Seed{Value: 6, At: (now/w+tc.seed)*w + 1}
		}
		// Grants of now's window, the one before and the one before that.
		at := func(win, off int64) int64 { return (now/w+win)*w + off }
		b := driver.Batch{ID: "app1:e1:" + tc.name, Key: key, Policy: p, Seed: seed, Grants: []driver.Grant{
			{Cost: 4, At: at(-2, 9_000_000)}, {Cost: 2, At: at(-1, 5)}, {Cost: 3, At: at(-1, 9_999_999)}, {Cost: 1, At: at(0, 0)},
		}}
		call, err := reconcile.New(reconcile.Options{MarkerTTL: time.Hour}).Call(&b, false)
		if err != nil {
			t.Fatal(err)
		}
		before := redisNow(t, srv)
		reply, err := runOne(ctx, store, call)
		after := redisNow(t, srv)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		lo, loAdded := slidingcounter.Replay(cur, ok, seed, lim, w, before, b.Grants)
		hi, hiAdded := slidingcounter.Replay(cur, ok, seed, lim, w, after, b.Grants)
		got, _ := stored(t, srv, key)
		switch {
		case got == lo && reflect.DeepEqual(reply, []int64{1, loAdded}):
		case got == hi && reflect.DeepEqual(reply, []int64{1, hiAdded}):
		default:
			t.Fatalf("%s: Redis holds %+v, replied %v; the model %+v (%d) at %d, %+v (%d) at %d", tc.name, got, reply, lo, loAdded, before, hi, hiAdded, after)
		}
		if again, err := runOne(ctx, store, call); err != nil || !reflect.DeepEqual(again, []int64{0, 0}) {
			t.Fatalf("%s: the batch again: %v %v, want [0 0]", tc.name, again, err)
		}
		if s, _ := stored(t, srv, key); s != got {
			t.Fatalf("%s: the batch again changed the key from %+v to %+v", tc.name, got, s)
		}
		if pttl, err := strconv.ParseInt(srv.Do(t, "PTTL", key), 10, 64); err != nil || pttl > 2*w/1000+1 {
			t.Fatalf("%s: PTTL %d ms (%v), want at most two windows", tc.name, pttl, err)
		}
		if pttl, err := strconv.ParseInt(srv.Do(t, "PTTL", call.Keys[0]), 10, 64); err != nil || pttl > 3_600_000 || pttl < 3_500_000 {
			t.Fatalf("%s: marker PTTL %d ms (%v), want about an hour", tc.name, pttl, err)
		}
		// A decision now sees the replayed counts: its remaining is the
		// limit less the estimate of the state Redis holds.
		dnow := redisNow(t, srv)
		r := storetest.Decide(t, store, p, key, 1, dnow)
		_, _, want := slidingcounter.Decide(got, true, dnow, lim, w, 1)
		if r.Allowed != (want[0] == 1) || r.Remaining != want[1] {
			t.Fatalf("%s: decision after the replay %+v, twin on the replayed state %v", tc.name, r, want)
		}
		t.Logf("%s: %+v -> %+v, counted %d", tc.name, cur, got, reply[1])
	}
}

// runOne runs call, the replay of one batch, and returns the batch's reply.
func runOne(ctx context.Context, store driver.Store, call driver.Call) ([]int64, error) {
	reply, err := store.Run(ctx, call.Script, call.Keys, call.Args)
	if err != nil {
		return nil, err
	}
	rs, ok := driver.SplitReply(reply, 1)
	if !ok || rs[0] == nil {
		return nil, fmt.Errorf("replay reply %v", reply)
	}
	return rs[0], nil
}

// TestReconcile: reconcile replays the counter's batches through
// driver.Replayer with nothing of its own for it: several keys in one
// pipelined Reconcile, then the same batches again after a lost
// acknowledgement, count once.
func TestReconcile(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	const lim, w = 10, 10_000_000
	p := must(slidingcounter.Policy("sc", lim, w*time.Microsecond))
	now := redisNow(t, srv)
	var batches []driver.Batch
	for i := range 3 {
		key := driver.StorageKey("hf:", "sc", fmt.Sprint("reconcile-", i))
		batches = append(batches, driver.Batch{ID: fmt.Sprint("app1:e1:", i), Key: key, Policy: p,
			Grants: []driver.Grant{{Cost: int64(i + 1), At: now - 1}, {Cost: 2, At: now}}})
	}
	r := reconcile.New(reconcile.Options{})
	for attempt := range 2 {
		for i, err := range r.Reconcile(context.Background(), store, batches) {
			if err != nil {
				t.Fatalf("attempt %d, batch %d: %v", attempt, i, err)
			}
		}
	}
	after := redisNow(t, srv)
	for i, b := range batches {
		got, _ := stored(t, srv, b.Key)
		lo, _ := slidingcounter.Replay(slidingcounter.State{}, false, driver.Seed{}, lim, w, now, b.Grants)
		hi, _ := slidingcounter.Replay(slidingcounter.State{}, false, driver.Seed{}, lim, w, after, b.Grants)
		if got != lo && got != hi {
			t.Errorf("key %d: Redis %+v, model %+v or %+v", i, got, lo, hi)
		}
		if got.Cur+got.Prev != int64(i+3) {
			t.Errorf("key %d: %+v counts %d units, want %d once", i, got, got.Cur+got.Prev, i+3)
		}
	}
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

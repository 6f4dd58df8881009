package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
)

// modes are the ways the replay tests send their batches: each in a call
// of its own; batched, each with a companion batch of the same instance (a
// batch id of the same run of sequence numbers) and hash slot, so that the
// two go in one call; and fresh, batched as well, each call first through
// driver.FreshScript, which writes missing keys and leaves the others to
// the replay script. The alone and batched modes use the replay scripts
// alone (newFor).
var modes = []string{"alone", "batched", "fresh"}

// newFor returns the Reconciler of o for mode.
func newFor(mode string, o reconcile.Options) *reconcile.Reconciler {
	o.FreshMin = -1
	if mode == "fresh" {
		o.FreshMin = 1
	}
	return reconcile.New(o)
}

// reconcileIn reconciles batches as mode says and returns each batch's
// outcome (a batch whose companion failed reports that failure too). In
// the batched modes it checks that a call applied several batches, and in
// the others that none did (TestBatchedPipelines checks that the fresh
// mode sends fresh calls).
func reconcileIn(t *testing.T, mode string, r *reconcile.Reconciler, store driver.Store, batches []driver.Batch) []error {
	t.Helper()
	if mode == "alone" {
		return r.Reconcile(context.Background(), store, batches)
	}
	all := append([]driver.Batch(nil), batches...)
	for _, b := range batches {
		// The companion's key has the batch's prefix and hash tag, so its
		// slot.
		c := b
		c.ID, c.Key = companionID(t, b.ID), b.Key+":companion"
		c.Grants = append([]driver.Grant(nil), b.Grants...)
		for i := range c.Grants {
			c.Grants[i].ID = "companion-" + c.Grants[i].ID
		}
		all = append(all, c)
	}
	rec := &recording{Store: store}
	errs := r.Reconcile(context.Background(), rec, all)
	// In the fresh mode a window batch without seed units goes plain, and
	// one with no unit in the window sends nothing.
	if !rec.multi() && (mode != "fresh" || len(rec.sizes) > 0) {
		t.Fatalf("%s: calls of %v batches, none of several", mode, rec.sizes)
	}
	if mode != "fresh" && rec.plain > 0 {
		t.Fatalf("%s: %d plain writes", mode, rec.plain)
	}
	if mode != "fresh" && rec.count(driver.FreshScript.Name()) > 0 {
		t.Fatalf("%s: fresh calls (calls %v)", mode, rec.names)
	}
	n := len(batches)
	for i := range n {
		if errs[i] == nil && errs[n+i] != nil {
			errs[i] = fmt.Errorf("companion: %w", errs[n+i])
		}
	}
	return errs[:n]
}

// companionID is an id of the same instance as id, instance:run:seq, and
// of the same run of sequence numbers: its marker shares id's hash.
func companionID(t *testing.T, id string) string {
	i := strings.LastIndexByte(id, ':')
	seq, err := strconv.Atoi(id[i+1:])
	if i < 0 || err != nil || seq >= 1000 {
		t.Fatalf("batch id %q: the batched mode needs instance:run:seq, seq below 1000", id)
	}
	return id[:i+1] + strconv.Itoa(seq+1000)
}

// recording is a Store that records the scripts it runs and how many
// batches each replay call applied; it pipelines when its store does. It
// sends plain commands (driver.Commander) through its store, which must be
// one, and counts the window keys they added to (ZADD commands).
type recording struct {
	driver.Store
	mu    sync.Mutex
	names []string
	sizes []int
	fresh int // batches sent in fresh calls
	plain int // ZADD commands sent plain
}

func (r *recording) RunCommands(ctx context.Context, cmds [][]string) []error {
	r.mu.Lock()
	for _, c := range cmds {
		if c[0] == "ZADD" {
			r.plain++
		}
	}
	r.mu.Unlock()
	return r.Store.(driver.Commander).RunCommands(ctx, cmds)
}

func (r *recording) note(s *driver.Script, args []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, s.Name())
	if (strings.HasPrefix(s.Name(), "reconcile_") || s == driver.FreshScript) && len(args) > 0 {
		n, _ := strconv.Atoi(args[0])
		r.sizes = append(r.sizes, n)
		if s == driver.FreshScript {
			r.fresh += n
		}
	}
}

func (r *recording) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	r.note(s, args)
	return r.Store.Run(ctx, s, keys, args)
}

// count is how many calls ran the script named name.
func (r *recording) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.names {
		if s == name {
			n++
		}
	}
	return n
}

// multi reports whether a replay call applied several batches.
func (r *recording) multi() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.sizes {
		if n > 1 {
			return true
		}
	}
	return false
}

// pipelining is a recording that also pipelines.
type pipelining struct {
	*recording
	pl driver.Pipeliner
}

func (p pipelining) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	for _, c := range calls {
		p.note(c.Script, c.Args)
	}
	return p.pl.RunMany(ctx, calls)
}

// TestCrashBetweenKeysCountsOnce: a call of two batches that stops between
// the two keys, the first batch applied and marked and the second not
// applied, and whose reply is lost (a crash), is sent again whole: the
// first batch counts once (its marker) and the second once. Here the
// second key holds a value that makes its replay fail after the first
// batch was applied; the key is repaired before the retry.
func TestCrashBetweenKeysCountsOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	tb, _ := tokenbucket.Policy("tb", 10, 1)
	sw, _ := slidingwindow.Policy("sw", 10, time.Minute)
	sc, _ := slidingcounter.Policy("sc", 10, time.Minute)
	for _, tc := range []struct {
		p core.Policy
		// spoil makes key's replay fail; repair undoes it.
		spoil, repair func(key string)
		// counted is what key holds of grants of 3 and 2 units.
		counted func(key string) int64
	}{
		{p: tb,
			spoil:  func(key string) { srv.Do(t, "HSET", key, "x", "1") },
			repair: func(key string) { srv.Do(t, "DEL", key) },
			counted: func(key string) int64 {
				now := redisNow(t, srv)
				return 10 - tokenbucket.FromEmpty(bucket(t, srv, key), now, 10e6).Credit/1e6
			}},
		{p: sw,
			spoil:   func(key string) { srv.Do(t, "SET", key, "x") },
			repair:  func(key string) { srv.Do(t, "DEL", key) },
			counted: func(key string) int64 { return int64(atoi(t, srv.Do(t, "ZCARD", key))) }},
		{p: sc,
			spoil:  func(key string) { srv.Do(t, "HSET", key, "x", "1") },
			repair: func(key string) { srv.Do(t, "DEL", key) },
			counted: func(key string) int64 {
				var k, c, p int64
				fmt.Sscanf(srv.Do(t, "GET", key), "%d:%d:%d", &k, &c, &p)
				return c + p
			}},
	} {
		name := tc.p.Algorithm().Name()
		t.Run(name, func(t *testing.T) {
			now := redisNow(t, srv)
			first := driver.StorageKey("hf:", tc.p.Name(), "between")
			second := first + ":second" // the same hash tag: the same slot
			batch := func(id, key string) driver.Batch {
				return driver.Batch{ID: id, Key: key, Policy: tc.p,
					Grants: []driver.Grant{{ID: id + "-a", Cost: 3, At: now - 1000}, {ID: id + "-b", Cost: 2, At: now}}}
			}
			// One instance per algorithm: batch ids are unique.
			batches := []driver.Batch{batch(name+":e1:1", first), batch(name+":e1:2", second)}
			tc.spoil(second)
			rec := &recording{Store: &crashAfter{Store: newStore(t, srv), fail: 1}}
			r := reconcile.New(reconcile.Options{})
			for i, err := range r.Reconcile(context.Background(), rec, batches) {
				if !errors.Is(err, errCrash) {
					t.Fatalf("batch %d: %v, want the lost reply", i, err)
				}
			}
			if fmt.Sprint(rec.sizes) != "[2]" {
				t.Fatalf("calls of %v batches, want one call of both", rec.sizes)
			}
			if got := tc.counted(first); got != 5 {
				t.Fatalf("after the crash the first key counts %d units, want 5", got)
			}
			tc.repair(second)
			for attempt := range 2 {
				for i, err := range r.Reconcile(context.Background(), rec, batches) {
					if err != nil {
						t.Fatalf("retry %d, batch %d: %v", attempt, i, err)
					}
				}
			}
			for _, key := range []string{first, second} {
				if got := tc.counted(key); got != 5 {
					t.Errorf("%s counts %d units, want 5: each batch once", key, got)
				}
			}
		})
	}
}

// TestFailedBatchInMultiCall: a batch whose replay raises an error inside a
// call of several is sent again on its own and gets its own error; the
// other batches of the call are applied, each once.
func TestFailedBatchInMultiCall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := slidingwindow.Policy("sw", 10, time.Minute)
	now := redisNow(t, srv)
	base := driver.StorageKey("hf:", "sw", "failed")
	var batches []driver.Batch
	for i := range 4 {
		id := fmt.Sprint("app1:e1:", i)
		batches = append(batches, driver.Batch{ID: id, Key: fmt.Sprint(base, ":", i), Policy: p,
			Grants: []driver.Grant{{ID: id + "-a", Cost: 2, At: now - 1000}}})
	}
	srv.Do(t, "SET", batches[2].Key, "not a window")
	rec := &recording{Store: store}
	errs := reconcile.New(reconcile.Options{}).Reconcile(context.Background(), rec, batches)
	for i, err := range errs {
		if (i == 2) != (err != nil) {
			t.Errorf("batch %d: %v", i, err)
		}
	}
	if !errors.Is(errs[2], core.ErrWrongType) {
		t.Errorf("batch 2: %v, want WRONGTYPE", errs[2])
	}
	if fmt.Sprint(rec.sizes) != "[4 1]" {
		t.Errorf("calls of %v batches, want the call of all four, then batch 2 alone", rec.sizes)
	}
	for i, b := range batches {
		if i != 2 && srv.Do(t, "ZCARD", b.Key) != "2" {
			t.Errorf("batch %d: ZCARD %s, want 2", i, srv.Do(t, "ZCARD", b.Key))
		}
	}
}

// TestBatchedPipelines: many keys of every algorithm, replayed through
// each backend's pipelines in multi-batch calls, count each grant once,
// as the calls of one batch each do; a replay of the same batches adds
// nothing.
func TestBatchedPipelines(t *testing.T) {
	t.Parallel()
	tb, _ := tokenbucket.Policy("btb", 100, 0.01) // keys that outlive the test: 300 s for 3 grants
	sw, _ := slidingwindow.Policy("bsw", 100, time.Minute)
	sc, _ := slidingcounter.Policy("bsc", 100, time.Minute)
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			var store driver.Store
			if backend == "goredis" {
				store = newStore(t, srv)
			} else {
				c, err := hfrueidis.NewClient(srv.URL(), hfrueidis.ClientOptions{ConnWriteTimeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				store = hfrueidis.New(c)
			}
			const n = 3000
			for _, p := range []core.Policy{tb, sw, sc} {
				now := redisNow(t, srv)
				// Batch ids are unique: one instance per policy and way.
				alone := reconcileBatches(p, "a-"+p.Name()+"-", n, now)
				for i := range alone {
					alone[i].Key = "alone:" + alone[i].Key
				}
				for i, err := range reconcile.New(reconcile.Options{MultiBatches: 1, FreshMin: -1, CallTimeout: 10 * time.Second}).Reconcile(context.Background(), store, alone) {
					if err != nil {
						t.Fatalf("%s alone batch %d: %v", p.Name(), i, err)
					}
				}
				// Batched through the replay scripts, and batched through
				// fresh calls first (the replay scripts for sc).
				for _, way := range []struct {
					name     string
					freshMin int
				}{{"scripts", -1}, {"fresh", 0}} {
					batches := reconcileBatches(p, way.name[:1]+"-"+p.Name()+"-", n, now)
					for i := range batches {
						batches[i].Key = way.name + ":" + batches[i].Key
					}
					rec := &recording{Store: store}
					multi := pipelining{recording: rec, pl: store.(driver.Pipeliner)}
					for attempt := range 2 {
						for i, err := range reconcile.New(reconcile.Options{FreshMin: way.freshMin, CallTimeout: 10 * time.Second}).Reconcile(context.Background(), multi, batches) {
							if err != nil {
								t.Fatalf("%s %s attempt %d batch %d: %v", p.Name(), way.name, attempt, i, err)
							}
						}
					}
					// Without seeds, the sliding window's batches go
					// plain, twice (they add nothing the second time), and
					// the other algorithms' in calls of several.
					_, fresh := p.Algorithm().(driver.FreshReplayer)
					_, plain := p.Algorithm().(driver.PlainReplayer)
					plain = plain && way.name == "fresh"
					if plain && (rec.plain != 2*n || len(rec.sizes) != 0) {
						t.Fatalf("%s %s: %d plain writes and calls of %v batches, want %d and none", p.Name(), way.name, rec.plain, rec.sizes, 2*n)
					}
					if !plain && (!rec.multi() || rec.plain != 0) {
						t.Fatalf("%s %s: calls of %v batches, none of several, or %d plain writes", p.Name(), way.name, rec.sizes, rec.plain)
					}
					if got, want := rec.count(driver.FreshScript.Name()) > 0, way.name == "fresh" && fresh && !plain; got != want {
						t.Errorf("%s %s: fresh calls %v, want %v", p.Name(), way.name, got, want)
					}
					// Keys on both sides of Reconcile's slices (1024
					// batches) and spread over the set.
					check := []int{0, 1, 1023, 1024, 2047, 2048, n - 1}
					for k := 5; k < n; k += 97 {
						check = append(check, k)
					}
					for _, k := range check {
						got, want := state(t, srv, p, batches[k].Key), state(t, srv, p, alone[k].Key)
						if got != want {
							t.Errorf("%s %s key %d: batched %q, alone %q", p.Name(), way.name, k, got, want)
						}
					}
				}
			}
		})
	}
}

// state is what key holds for p, equal for two keys replayed with the
// same grants: the token bucket's instant of zero credit (without the
// merge log, which holds the time of its replay), the window's size, the
// counter's units.
func state(t *testing.T, srv *redistest.Server, p core.Policy, key string) string {
	switch p.Algorithm().Name() {
	case slidingwindow.Algorithm.Name():
		return srv.Do(t, "ZCARD", key)
	case slidingcounter.Algorithm.Name():
		// "window:current:previous": the window is Redis's at the replay,
		// which may have turned between the two.
		v := srv.Do(t, "GET", key)
		var k, c, pr int64
		if _, err := fmt.Sscanf(v, "%d:%d:%d", &k, &c, &pr); err != nil {
			t.Fatalf("%s: %q: %v", key, v, err)
		}
		return fmt.Sprint(c + pr)
	}
	e, err := tokenbucket.ParseStored(srv.Do(t, "GET", key))
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return fmt.Sprint(e)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// TestRefusedBatchInMultiCall: a batch whose replay replies an error (a
// corrupt bucket) inside a call of several leaves the other batches of
// the call applied; it alone is sent again, and gets its own error.
func TestRefusedBatchInMultiCall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	p, _ := tokenbucket.Policy("tb", 10, 1)
	now := redisNow(t, srv)
	base := driver.StorageKey("hf:", "tb", "refused")
	var batches []driver.Batch
	for i := range 3 {
		batches = append(batches, driver.Batch{ID: fmt.Sprint("app1:e1:", i), Key: fmt.Sprint(base, ":", i), Policy: p,
			Grants: []driver.Grant{{Cost: 2, At: now}}})
	}
	srv.Do(t, "SET", batches[1].Key, "corrupt")
	rec := &recording{Store: newStore(t, srv)}
	errs := reconcile.New(reconcile.Options{}).Reconcile(context.Background(), rec, batches)
	if errs[0] != nil || errs[2] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "corrupt state") {
		t.Fatalf("errors %v, want only batch 1's corrupt state", errs)
	}
	if fmt.Sprint(rec.sizes) != "[3 1]" {
		t.Errorf("calls of %v batches, want the call of all three, then batch 1 alone", rec.sizes)
	}
	for _, i := range []int{0, 2} {
		if c := tokenbucket.FromEmpty(bucket(t, srv, batches[i].Key), now, 10e6).Credit; c != 8e6 {
			t.Errorf("batch %d: credit %d, want 8 tokens", i, c)
		}
	}
}

// smallPolicies are a token bucket of 10 refilled at 100/s, and a sliding
// window and a sliding window counter of 10 a minute, named prefix+"tb",
// "sw" and "sc".
func smallPolicies(prefix string) []core.Policy {
	tb, _ := tokenbucket.Policy(prefix+"tb", 10, 100)
	sw, _ := slidingwindow.Policy(prefix+"sw", 10, time.Minute)
	sc, _ := slidingcounter.Policy(prefix+"sc", 10, time.Minute)
	return []core.Policy{tb, sw, sc}
}

// TestFreshCalls: a call of several batches skips reading its keys only
// when none of them exists and each is its own; otherwise each body reads
// its key. Three calls per algorithm, each replayed batched and alone (on
// keys of their own) from the same state, must leave the same state: one
// with a key twice (the second batch must see the first's write), one
// with a key that exists among missing ones, one of missing keys only.
func TestFreshCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	for _, p := range smallPolicies("b") {
		now := redisNow(t, srv)
		seq := 0
		batch := func(prefix, key string, cost int64) driver.Batch {
			// One instance per policy and mode: the batches of a call
			// share a marker hash, and no batch id is another's.
			seq++
			id := fmt.Sprintf("%s%s:e:%d", prefix, p.Name(), seq)
			return driver.Batch{ID: id, Key: driver.StorageKey("hf:", p.Name(), prefix+key), Policy: p,
				Grants: []driver.Grant{{ID: id + "-a", Cost: cost, At: now - 2000}, {ID: id + "-b", Cost: 1, At: now - 1000}}}
		}
		calls := [][][2]string{
			{{"k1", "3"}, {"k2", "2"}, {"k1", "4"}}, // k1 twice
			{{"k3", "1"}, {"k2", "2"}},              // k2 exists now
			{{"k4", "2"}, {"k5", "5"}},              // none exists
		}
		for c, call := range calls {
			for _, mode := range []string{"batched", "alone"} {
				var batches []driver.Batch
				for _, b := range call {
					cost, _ := strconv.ParseInt(b[1], 10, 64)
					batches = append(batches, batch(mode+":", b[0], cost))
				}
				rec := &recording{Store: store}
				r := reconcile.New(reconcile.Options{})
				if mode == "alone" {
					r = reconcile.New(reconcile.Options{MultiBatches: 1})
				}
				for i, err := range r.Reconcile(context.Background(), rec, batches) {
					if err != nil {
						t.Fatalf("%s call %d %s batch %d: %v", p.Name(), c, mode, i, err)
					}
				}
				if mode == "batched" && !rec.multi() {
					t.Fatalf("%s call %d: calls of %v batches, none of several", p.Name(), c, rec.sizes)
				}
			}
			for _, b := range call {
				k := b[0]
				got := state(t, srv, p, driver.StorageKey("hf:", p.Name(), "batched:"+k))
				want := state(t, srv, p, driver.StorageKey("hf:", p.Name(), "alone:"+k))
				if got != want {
					t.Errorf("%s call %d key %s: batched %q, alone %q", p.Name(), c, k, got, want)
				}
			}
		}
	}
}

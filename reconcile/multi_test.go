package reconcile_test

import (
	"context"
	"errors"
	"fmt"
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

// modes are the two ways the replay tests send their batches: each in a
// call of its own, and batched, each with a companion batch of the same
// hash slot, so that the two go in one multi-batch call.
var modes = []string{"alone", "batched"}

// reconcileIn reconciles batches as mode says and returns each batch's
// outcome (a batch whose companion failed reports that failure too). In
// the batched mode it checks that a multi-batch script ran.
func reconcileIn(t *testing.T, mode string, r *reconcile.Reconciler, store driver.Store, batches []driver.Batch) []error {
	t.Helper()
	if mode == "alone" {
		return r.Reconcile(context.Background(), store, batches)
	}
	all := append([]driver.Batch(nil), batches...)
	for _, b := range batches {
		// The companion's key has the batch's hash tag, so its slot.
		c := b
		c.ID, c.Key = "companion-"+b.ID, "companion:"+b.Key
		c.Grants = append([]driver.Grant(nil), b.Grants...)
		for i := range c.Grants {
			c.Grants[i].ID = "companion-" + c.Grants[i].ID
		}
		all = append(all, c)
	}
	rec := &recording{Store: store}
	errs := r.Reconcile(context.Background(), rec, all)
	if !rec.ran("_multi") {
		t.Fatalf("batched: scripts %v, no multi-batch call", rec.names)
	}
	n := len(batches)
	for i := range n {
		if errs[i] == nil && errs[n+i] != nil {
			errs[i] = fmt.Errorf("companion: %w", errs[n+i])
		}
	}
	return errs[:n]
}

// recording is a Store that records the names of the scripts it runs; it
// pipelines when its store does.
type recording struct {
	driver.Store
	mu    sync.Mutex
	names []string
}

func (r *recording) note(s *driver.Script) {
	r.mu.Lock()
	r.names = append(r.names, s.Name())
	r.mu.Unlock()
}

func (r *recording) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	r.note(s)
	return r.Store.Run(ctx, s, keys, args)
}

func (r *recording) ran(suffix string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.names {
		if strings.HasSuffix(n, suffix) {
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
		p.note(c.Script)
	}
	return p.pl.RunMany(ctx, calls)
}

// lostReply applies every call on the store, then reports the first
// failure of a call as a lost reply: the process died after Redis ran (part
// of) the call, before it read the reply.
type lostReply struct {
	driver.Store
	lost int
}

func (l *lostReply) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	r, err := l.Store.Run(ctx, s, keys, args)
	if err != nil && l.lost > 0 {
		l.lost--
		return nil, errCrash
	}
	return r, err
}

// TestCrashBetweenKeysCountsOnce: a multi-batch call that stops between
// two keys, the first batch applied and marked and the second not run,
// and whose reply is lost (a crash), is sent again whole: the first batch
// counts once (its marker) and the second once. Redis has no crash inside
// a script, but a script that fails midway leaves the same state: here the
// second key holds a value of the wrong type, which makes its replay raise
// an error after the first batch was applied; the key is repaired before
// the retry.
func TestCrashBetweenKeysCountsOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	tb, _ := tokenbucket.Policy("tb", 10, 1)
	sw, _ := slidingwindow.Policy("sw", 10, time.Minute)
	sc, _ := slidingcounter.Policy("sc", 10, time.Minute)
	for _, tc := range []struct {
		p core.Policy
		// spoil makes key's replay raise an error; repair undoes it.
		spoil, repair func(key string)
		// counted is what key holds of grants of 3 and 2 units.
		counted func(key string) int64
	}{
		{p: tb,
			spoil:  func(key string) { srv.Do(t, "SET", reconcile.MergeKey(key), "x") },
			repair: func(key string) { srv.Do(t, "DEL", reconcile.MergeKey(key)) },
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
			second := "second:" + first // the same hash tag: the same slot
			batch := func(id, key string) driver.Batch {
				return driver.Batch{ID: id, Key: key, Policy: tc.p,
					Grants: []driver.Grant{{ID: id + "-a", Cost: 3, At: now - 1000}, {ID: id + "-b", Cost: 2, At: now}}}
			}
			batches := []driver.Batch{batch("app1:e1:1", first), batch("app1:e1:2", second)}
			tc.spoil(second)
			rec := &recording{Store: &lostReply{Store: newStore(t, srv), lost: 1}}
			r := reconcile.New(reconcile.Options{})
			for i, err := range r.Reconcile(context.Background(), rec, batches) {
				if !errors.Is(err, errCrash) {
					t.Fatalf("batch %d: %v, want the lost reply", i, err)
				}
			}
			if len(rec.names) != 1 || !rec.ran("_multi") {
				t.Fatalf("scripts %v, want one multi-batch call", rec.names)
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

// TestFailedBatchInMultiCall: a batch whose replay fails inside a
// multi-batch call is sent again on its own and gets its own error; the
// batches of the call applied before it are acknowledged (their markers),
// those after it applied, each once.
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
		batches = append(batches, driver.Batch{ID: id, Key: fmt.Sprint(i, ":", base), Policy: p,
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
	if rec.names[0] != slidingwindow.ReplayMultiScript.Name() || len(rec.names) != 1+len(batches) {
		t.Errorf("scripts %v, want the multi-batch call, then each batch of it alone", rec.names)
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
	tb, _ := tokenbucket.Policy("btb", 100, 10)
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
				batches := reconcileBatches(p, "b-", n, now)
				alone := reconcileBatches(p, "a-", n, now)
				for i := range alone {
					alone[i].Key = "alone:" + alone[i].Key
				}
				rec := &recording{Store: store}
				multi := pipelining{recording: rec, pl: store.(driver.Pipeliner)}
				for attempt := range 2 {
					for i, err := range reconcile.New(reconcile.Options{CallTimeout: 10 * time.Second}).Reconcile(context.Background(), multi, batches) {
						if err != nil {
							t.Fatalf("%s attempt %d batch %d: %v", p.Name(), attempt, i, err)
						}
					}
				}
				if !rec.ran("_multi") {
					t.Fatalf("%s: no multi-batch call", p.Name())
				}
				for i, err := range reconcile.New(reconcile.Options{MultiBatches: 1, CallTimeout: 10 * time.Second}).Reconcile(context.Background(), store, alone) {
					if err != nil {
						t.Fatalf("%s alone batch %d: %v", p.Name(), i, err)
					}
				}
				for _, k := range []int{0, 1, n / 2, n - 1} {
					got, want := state(t, srv, p, batches[k].Key), state(t, srv, p, alone[k].Key)
					if got != want {
						t.Errorf("%s key %d: batched %q, alone %q", p.Name(), k, got, want)
					}
				}
			}
		})
	}
}

// state is what key holds for p, equal for two keys replayed with the
// same grants: the token bucket's instant of zero credit, the window's
// size, the counter's units.
func state(t *testing.T, srv *redistest.Server, p core.Policy, key string) string {
	switch p.Name() {
	case "bsw":
		return srv.Do(t, "ZCARD", key)
	case "bsc":
		// "window:current:previous": the window is Redis's at the replay,
		// which may have turned between the two.
		v := srv.Do(t, "GET", key)
		var k, c, pr int64
		if _, err := fmt.Sscanf(v, "%d:%d:%d", &k, &c, &pr); err != nil {
			t.Fatalf("%s: %q: %v", key, v, err)
		}
		return fmt.Sprint(c + pr)
	}
	return srv.Do(t, "GET", key)
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
// corrupt bucket) inside a multi-batch call leaves the other batches of
// the call applied; it alone is sent again, and gets its own error.
func TestRefusedBatchInMultiCall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	p, _ := tokenbucket.Policy("tb", 10, 1)
	now := redisNow(t, srv)
	base := driver.StorageKey("hf:", "tb", "refused")
	var batches []driver.Batch
	for i := range 3 {
		batches = append(batches, driver.Batch{ID: fmt.Sprint("app1:e1:", i), Key: fmt.Sprint(i, ":", base), Policy: p,
			Grants: []driver.Grant{{Cost: 2, At: now}}})
	}
	srv.Do(t, "SET", batches[1].Key, "corrupt")
	rec := &recording{Store: newStore(t, srv)}
	errs := reconcile.New(reconcile.Options{}).Reconcile(context.Background(), rec, batches)
	if errs[0] != nil || errs[2] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "corrupt state") {
		t.Fatalf("errors %v, want only batch 1's corrupt state", errs)
	}
	if want := []string{tokenbucket.ReplayMultiScript.Name(), tokenbucket.ReplayScript.Name()}; fmt.Sprint(rec.names) != fmt.Sprint(want) {
		t.Errorf("scripts %v, want %v", rec.names, want)
	}
	for _, i := range []int{0, 2} {
		if c := tokenbucket.FromEmpty(bucket(t, srv, batches[i].Key), now, 10e6).Credit; c != 8e6 {
			t.Errorf("batch %d: credit %d, want 8 tokens", i, c)
		}
	}
}

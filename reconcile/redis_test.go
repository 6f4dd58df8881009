package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
)

func newStore(t testing.TB, srv *redistest.Server) core.Store {
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
	core.Store
	fail int
}

var errCrash = errors.New("injected crash after apply")

func (c *crashAfter) Run(ctx context.Context, s *core.Script, keys, args []string) ([]int64, error) {
	r, err := c.Store.Run(ctx, s, keys, args)
	if err == nil && c.fail > 0 {
		c.fail--
		return nil, errCrash
	}
	return r, err
}

func bucket(t *testing.T, srv *redistest.Server, key string) tokenbucket.State {
	t.Helper()
	c, _ := strconv.ParseInt(srv.Do(t, "HGET", key, "c"), 10, 64)
	ts, _ := strconv.ParseInt(srv.Do(t, "HGET", key, "t"), 10, 64)
	return tokenbucket.State{Credit: c, Last: ts}
}

// TestCrashMidReconcileCountsOnce: a batch applied whose acknowledgement was
// lost is sent again with the same id, and Redis counts it once.
func TestCrashMidReconcileCountsOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := &crashAfter{Store: newStore(t, srv), fail: 1}
	p, _ := tokenbucket.Policy("tb", 10, 1)
	now := time.Now().UnixMicro()
	key := core.StorageKey("hf:", "tb", "crash")
	b := core.Batch{ID: "app1:run:1", Key: key, Policy: p, Seed: core.Seed{Value: 10e6, At: now},
		Grants: []core.Grant{{Cost: 3, At: now}, {Cost: 2, At: now}}}
	r := reconcile.New(reconcile.Options{})
	if errs := r.Reconcile(context.Background(), store, []core.Batch{b}); !errors.Is(errs[0], errCrash) {
		t.Fatalf("first attempt: %v, want the injected crash", errs[0])
	}
	for attempt := range 3 {
		if errs := r.Reconcile(context.Background(), store, []core.Batch{b}); errs[0] != nil {
			t.Fatalf("retry %d: %v", attempt, errs[0])
		}
	}
	got := bucket(t, srv, key)
	if got.Credit != 5e6 || got.Last != now {
		t.Fatalf("bucket %+v, want 5 tokens (10 - 3 - 2) at %d: the batch counted once", got, now)
	}
}

// TestScriptMatchesModel: the replay script on Redis and ReplayTokenBucket
// agree on the stored bucket, with a stored state, with a seed, and with
// nothing.
func TestScriptMatchesModel(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := tokenbucket.Policy("tb", 10, 4) // 250 ms a token
	full := int64(10 * 250_000)
	now := time.Now().UnixMicro()
	grants := []core.Grant{{Cost: 4, At: now - 900_000}, {Cost: 4, At: now - 800_000}, {Cost: 5, At: now - 100_000}, {Cost: 3, At: now}}
	for i, tc := range []struct {
		stored *tokenbucket.State
		seed   core.Seed
	}{
		{stored: &tokenbucket.State{Credit: 1_000_000, Last: now - 1_000_000}},
		{stored: &tokenbucket.State{Credit: 0, Last: now - 500_000}}, // newer than some grants
		{seed: core.Seed{Value: 500_000, At: now - 2_000_000}},
		{},
	} {
		key := core.StorageKey("hf:", "tb", fmt.Sprint("model-", i))
		if tc.stored != nil {
			srv.Do(t, "HSET", key, "c", fmt.Sprint(tc.stored.Credit), "t", fmt.Sprint(tc.stored.Last))
		}
		b := core.Batch{ID: fmt.Sprint("b", i), Key: key, Policy: p, Seed: tc.seed, Grants: grants}
		if errs := reconcile.New(reconcile.Options{}).Reconcile(context.Background(), store, []core.Batch{b}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		var st tokenbucket.State
		if tc.stored != nil {
			st = *tc.stored
		}
		want := reconcile.ReplayTokenBucket(st, tc.stored != nil, tc.seed, &reconcile.MergeLog{}, 10, 250_000, grants)
		if got := bucket(t, srv, key); got != want {
			t.Errorf("case %d: Redis %+v, model %+v", i, got, want)
		}
		if want.Credit < -full || want.Credit > full {
			t.Errorf("case %d: credit %d outside ±one bucket", i, want.Credit)
		}
	}
}

// TestScriptMergesInstances: three instances' batches for one key, replayed
// through Redis one after another, leave the bucket where the Go model (one
// global bucket fed all grants) does.
func TestScriptMergesInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := tokenbucket.Policy("tb", 10, 10) // 100 ms a token
	now := time.Now().UnixMicro()
	key := core.StorageKey("hf:", "tb", "merge")
	start := tokenbucket.State{Credit: 2 * 100_000, Last: now - 3_000_000}
	srv.Do(t, "HSET", key, "c", fmt.Sprint(start.Credit), "t", fmt.Sprint(start.Last))
	var m reconcile.MergeLog
	want := start
	r := reconcile.New(reconcile.Options{})
	for i := range 3 {
		var grants []core.Grant
		for j := range 10 {
			// Each instance admits 2.5 a second, interleaved with the others.
			grants = append(grants, core.Grant{Cost: 1, At: now - 3_000_000 + int64(j)*400_000 + int64(i)*133_000})
		}
		b := core.Batch{ID: fmt.Sprint("app", i), Key: key, Policy: p, Grants: grants}
		if errs := r.Reconcile(context.Background(), store, []core.Batch{b}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		want = reconcile.ReplayTokenBucket(want, true, core.Seed{}, &m, 10, 100_000, grants)
		if got := bucket(t, srv, key); got != want {
			t.Fatalf("after instance %d: Redis %+v, model %+v", i, got, want)
		}
	}
	// 30 grants over 3 s at 10 a second of refill, from 2 tokens: one global
	// bucket never fills, so it ends at 2 + 26.x - 30 tokens, not in a debt
	// of a whole bucket as charging the later instances without refill would.
	if want.Credit < -2*100_000 {
		t.Fatalf("credit %d: the merge charged more than one global bucket", want.Credit)
	}
}

// TestSlidingWindowReplay: grants land at their original times, a replay of
// the same grants under another batch id adds nothing (request ids), grants
// outside the window are skipped, and an empty key is seeded.
func TestSlidingWindowReplay(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := slidingwindow.Policy("sw", 10, 10*time.Second)
	now := time.Now().UnixMicro()
	key := core.StorageKey("hf:", "sw", "replay")
	grants := []core.Grant{
		{ID: "old", Cost: 1, At: now - 20_000_000}, // outside the window
		{ID: "a", Cost: 1, At: now - 5_000_000},
		{ID: "b", Cost: 3, At: now - 1_000_000},
	}
	seed := core.Seed{Value: 2, At: now - 3_000_000}
	r := reconcile.New(reconcile.Options{})
	for _, id := range []string{"batch-1", "batch-1", "batch-2"} {
		b := core.Batch{ID: id, Key: key, Policy: p, Seed: seed, Grants: grants}
		if errs := r.Reconcile(context.Background(), store, []core.Batch{b}); errs[0] != nil {
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
}

// BenchmarkReconcile replays the outage logs of 1k, 10k and 100k token
// bucket keys (three grants each) into one Redis, through each backend's
// pipelines.
func BenchmarkReconcile(b *testing.B) {
	for _, backend := range []string{"goredis", "rueidis"} {
		b.Run(backend, func(b *testing.B) { benchReconcile(b, backend) })
	}
}

func benchReconcile(b *testing.B, backend string) {
	srv := redistest.Start(b)
	var store core.Store
	if backend == "goredis" {
		store = newStore(b, srv)
	} else {
		c, err := hfrueidis.NewClient(srv.URL(), hfrueidis.ClientOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		store = hfrueidis.New(c)
	}
	p, _ := tokenbucket.Policy("tb", 100, 10)
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprint(n, "_keys"), func(b *testing.B) {
			r := reconcile.New(reconcile.Options{})
			for i := range b.N {
				now := time.Now().UnixMicro()
				batches := make([]core.Batch, n)
				for k := range batches {
					batches[k] = core.Batch{ID: fmt.Sprint("bench-", i, "-", k), Key: core.StorageKey("hf:", "tb", fmt.Sprint(k)), Policy: p,
						Grants: []core.Grant{{Cost: 1, At: now - 2000}, {Cost: 1, At: now - 1000}, {Cost: 1, At: now}}}
				}
				for _, err := range r.Reconcile(context.Background(), store, batches) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

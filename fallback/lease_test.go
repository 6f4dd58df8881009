package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

const ms = int64(time.Millisecond / time.Microsecond)

type leaseStep struct {
	at        int64 // microseconds
	cost      int64
	allowed   bool
	remaining int64
	retry     int64 // microseconds
}

func runLease(t *testing.T, k *keyState, p core.Policy, n int64, steps []leaseStep) {
	t.Helper()
	for i, s := range steps {
		r := decideLease(k, p, n, s.at, s.cost)
		if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry {
			t.Fatalf("step %d at %dms: got allowed=%v remaining=%d retry=%dµs, want %v %d %dµs",
				i, s.at/ms, r.Allowed, r.Remaining, r.RetryAfter, s.allowed, s.remaining, s.retry)
		}
	}
}

// An unseen key gets capacity/N, refilled at rate/N: capacity 10 at 10/s
// over 4 instances is 2.5 tokens refilled at 2.5/s, fractions kept.
func TestLeaseTokenBucketUnseenKey(t *testing.T) {
	p, _ := tokenbucket.Policy("tb", 10, 10) // T = 100 ms
	runLease(t, &keyState{}, p, 4, []leaseStep{
		{0, 1, true, 1, 0},
		{0, 1, true, 0, 0},
		{0, 1, false, 0, 200 * ms}, // half a local token left: 200 ms of 400
		{200 * ms, 1, true, 0, 0},
		{1000 * ms, 1, true, 1, 0}, // 800 ms refilled 2 local tokens
	})
}

// A key Redis last saw with 8 of 20 tokens leaves each of 4 instances 2.
func TestLeaseTokenBucketFromKnownState(t *testing.T) {
	p, _ := tokenbucket.Policy("tb", 20, 5) // T = 200 ms
	k := &keyState{}
	k.observe(p, 1, driver.Reply{Allowed: true, Remaining: 8, ResetAfter: 12 * 200 * ms, Now: 1})
	runLease(t, k, p, 4, []leaseStep{
		{1, 1, true, 1, 0},
		{1, 1, true, 0, 0},
		{1, 1, false, 0, 800 * ms},
		{1 + 800*ms, 1, true, 0, 0},
	})
	if k.seed != (driver.Seed{Value: 8 * 200 * ms, At: 1}) {
		t.Fatalf("seed %+v, want the known credit", k.seed)
	}
}

// A policy smaller than the instance count still admits one unit each.
func TestLeaseShareAtLeastOne(t *testing.T) {
	p, _ := tokenbucket.Policy("tiny", 2, 1)
	runLease(t, &keyState{}, p, 4, []leaseStep{
		{0, 1, true, 0, 0},
		{0, 1, false, 0, 4000 * ms},
	})
}

// A sliding window carries the known count in until its newest unit leaves
// the window: limit 10 with 6 used leaves each of 4 instances (10-6)/4 = 1.
func TestLeaseSlidingWindow(t *testing.T) {
	p, _ := slidingwindow.Policy("sw", 10, time.Second)
	k := &keyState{}
	// Redis admitted at -500ms leaving 4: 6 units, the newest at -500ms.
	const t0 = 10_000 * ms
	k.observe(p, 1, driver.Reply{Allowed: true, Remaining: 4, ResetAfter: 1000 * ms, Now: t0 - 500*ms})
	runLease(t, k, p, 4, []leaseStep{
		{t0, 1, true, 0, 0},
		{t0 + 100*ms, 1, false, 0, 400 * ms}, // the carried-in 6 leave at 500 ms
		{t0 + 500*ms, 1, true, 0, 0},
		{t0 + 600*ms, 1, false, 0, 400 * ms}, // the unit at 0 leaves at 1 s
		{t0 + 1000*ms, 1, true, 0, 0},
	})
}

// A cost above the share can never be admitted locally: told to wait a window.
func TestLeaseCostAboveShare(t *testing.T) {
	p, _ := slidingwindow.Policy("sw", 8, time.Second)
	runLease(t, &keyState{}, p, 4, []leaseStep{{0, 3, false, 2, 1000 * ms}})
}

// A lease goes on until Redis reports something newer than its last
// decision; then it restarts from that.
func TestLeaseRestartsFromFresherRedisView(t *testing.T) {
	p, _ := tokenbucket.Policy("tb", 4, 0.001)
	k := &keyState{}
	for range 2 {
		if r := decideLease(k, p, 2, 10, 1); !r.Allowed {
			t.Fatal("denied within the share")
		}
	}
	if r := decideLease(k, p, 2, 20, 1); r.Allowed {
		t.Fatal("admitted beyond the share of 2")
	}
	// An older Redis view does not restart it.
	k.observe(p, 1, driver.Reply{Allowed: true, Remaining: 4, ResetAfter: 0, Now: 5})
	if r := decideLease(k, p, 2, 30, 1); r.Allowed {
		t.Fatal("a Redis view older than the lease restarted it")
	}
	// A newer one does: Redis says 4 tokens, 2 of them this instance's.
	k.observe(p, 1, driver.Reply{Allowed: true, Remaining: 4, ResetAfter: 0, Now: 40})
	if r := decideLease(k, p, 2, 50, 1); !r.Allowed {
		t.Fatal("a newer Redis view did not restart the lease")
	}
}

func TestOutageLogBound(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 100, 1)
	sw, _ := slidingwindow.Policy("sw", 100, time.Second)
	g := newOutageLog("app1:x", "hf:", 4)
	for i := range 3 {
		if err := g.add("a", tb, driver.Seed{}, driver.Grant{Cost: 1, At: int64(i) * ms}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.add("b", sw, driver.Seed{}, driver.Grant{ID: "old", Cost: 1, At: 0}); err != nil {
		t.Fatal(err)
	}
	// Full: compaction merges a's three grants into one (cost 3 at the
	// latest time) and drops b's grant, which has left its window.
	if err := g.add("b", sw, driver.Seed{}, driver.Grant{ID: "new", Cost: 1, At: 2000 * ms}); err != nil {
		t.Fatalf("after compaction: %v", err)
	}
	if g.pending() != 2 {
		t.Fatalf("pending %d, want 2", g.pending())
	}
	batches := g.seal()
	if len(batches) != 2 || batches[0].Key != "a" || len(batches[0].Grants) != 1 || batches[0].Grants[0].Cost != 3 || batches[0].Grants[0].At != 2*ms {
		t.Fatalf("batches %+v", batches)
	}
	// Nothing more can be compacted: the log refuses rather than forgets.
	for _, id := range []string{"n1", "n2"} {
		_ = g.add("c", sw, driver.Seed{}, driver.Grant{ID: id, Cost: 1, At: 2000 * ms})
	}
	if err := g.add("c", sw, driver.Seed{}, driver.Grant{ID: "n3", Cost: 1, At: 2000 * ms}); !errors.Is(err, ErrLogFull) {
		t.Fatalf("err = %v, want ErrLogFull", err)
	}
	// A failed batch keeps its ID for the retry; an acknowledged one goes.
	g.ack(batches, []error{nil, errors.New("timeout")})
	again := g.seal()
	if again[0].ID != batches[1].ID {
		t.Fatalf("retried batch %s, want the same id %s", again[0].ID, batches[1].ID)
	}
	if again[0].ID == again[1].ID {
		t.Fatal("two batches share an id")
	}
}

// A hot token bucket key's grants are coalesced per millisecond, and a key
// with many grants replays in batches of at most a thousand.
func TestOutageLogSealBounds(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 100, 1)
	sw, _ := slidingwindow.Policy("sw", 100_000, time.Minute)
	g := newOutageLog("app1:x", "hf:", 1<<20)
	for i := range 3000 {
		_ = g.add("hot", tb, driver.Seed{}, driver.Grant{Cost: 1, At: 1_000_000 + int64(i)})
		_ = g.add("win", sw, driver.Seed{}, driver.Grant{ID: fmt.Sprint(i), Cost: 1, At: 1_000_000 + int64(i)})
	}
	batches := g.seal()
	var hot, win, total int
	ids := map[string]bool{}
	for _, b := range batches {
		ids[b.ID] = true
		if len(b.Grants) > 1000 {
			t.Fatalf("batch of %d grants", len(b.Grants))
		}
		for _, gr := range b.Grants {
			total += int(gr.Cost)
		}
		if b.Key == "hot" {
			hot += len(b.Grants)
		} else {
			win += len(b.Grants)
		}
	}
	if hot != 3 || win != 3000 || total != 6000 || len(ids) != len(batches) || len(batches) != 4 {
		t.Fatalf("hot %d grants, window %d grants, cost %d, %d batches, %d ids", hot, win, total, len(batches), len(ids))
	}
	if g.pending() != 3003 {
		t.Fatalf("pending %d, want 3003", g.pending())
	}
}

// A token bucket key's grants are coalesced as they are logged: ten
// thousand grants over 5 ms take five entries of a log bounded at 8, keep
// their whole cost, and each entry is charged no earlier than the grants it
// holds. Sliding window grants (each with its own request id) are not.
func TestOutageLogCoalescesOnAdd(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 100, 1)
	sw, _ := slidingwindow.Policy("sw", 100, time.Second)
	g := newOutageLog("app1:x", "hf:", 8)
	latest := map[int64]int64{} // group (ms) -> latest grant in it
	for i := range 10_000 {
		at := 1_000_000 + int64(i)/2
		if i%7 == 3 {
			at -= 300 // out of order, as concurrent callers log
		}
		if err := g.add("hot", tb, driver.Seed{}, driver.Grant{Cost: 2, At: at}); err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		latest[at/ms] = max(latest[at/ms], at)
	}
	if got := g.pending(); got != 5 {
		t.Fatalf("pending %d after 10000 grants over 5 ms, want 5", got)
	}
	for i := range 3 {
		if err := g.add("win", sw, driver.Seed{}, driver.Grant{ID: fmt.Sprint(i), Cost: 1, At: 1_000_000}); err != nil {
			t.Fatal(err)
		}
	}
	var cost int64
	for _, b := range g.seal() {
		if b.Key == "win" {
			if len(b.Grants) != 3 {
				t.Fatalf("sliding window grants %d, want 3", len(b.Grants))
			}
			continue
		}
		for _, gr := range b.Grants {
			cost += gr.Cost
			if gr.At < latest[gr.At/ms] {
				t.Errorf("entry at %d holds a grant at %d: charged too early", gr.At, latest[gr.At/ms])
			}
		}
	}
	if cost != 20_000 {
		t.Fatalf("logged cost %d, want 20000", cost)
	}
}

// Grants that join a key's live log entry without the log's lock are never
// lost: 8 keys, each written by 4 goroutines serialized by a per-key lock
// (the lease lock's role), while the log is sealed and acknowledged over
// and over (recovery flushes). Every unit admitted is in exactly one sealed
// batch.
func TestOutageLogLiveGrantsCountOnce(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 1_000_000, 1000)
	g := newOutageLog("app1:x", "hf:", 1<<20)
	type keyLock struct {
		sync.Mutex
		live *liveGrant
		at   int64
	}
	keys := make([]*keyLock, 8)
	for i := range keys {
		keys[i] = &keyLock{at: 1_000_000}
	}
	var added, sealed atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	sealerDone := make(chan struct{})
	go func() {
		defer close(sealerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			bs := g.seal()
			for _, b := range bs {
				for _, gr := range b.Grants {
					sealed.Add(gr.Cost)
				}
			}
			g.ack(bs, make([]error, len(bs)))
		}
	}()
	for w := range 32 {
		wg.Go(func() {
			k := keys[w%len(keys)]
			name := fmt.Sprint("k", w%len(keys))
			for i := range 20_000 {
				k.Lock()
				k.at += int64(1 + i%7*50) // groups open and close
				cost := int64(1 + i%3)
				if k.live == nil || !k.live.add(cost, k.at) {
					var err error
					if k.live, err = g.addParts(name, tb, driver.Seed{}, driver.Grant{Cost: cost, At: k.at}); err != nil {
						t.Error(err)
					}
				}
				added.Add(cost)
				k.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sealerDone
	for _, b := range g.seal() {
		for _, gr := range b.Grants {
			sealed.Add(gr.Cost)
		}
	}
	if added.Load() != sealed.Load() {
		t.Fatalf("added %d units, sealed %d", added.Load(), sealed.Load())
	}
}

// The live instance count rises at once and falls only after the lower
// count has held for ShrinkAfter, to the highest count seen meanwhile, and
// only once the breaker has been closed for three heartbeats.
func TestInstanceCountShrinksAfterHolding(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l, err := New(stubStore{}, Options{
		ID: "a", ExpectedInstances: 4, Heartbeat: time.Second, ShrinkAfter: 30 * time.Second,
		Clock: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.closedSince.Store(now.UnixNano()) // as Start does
	steps := []struct {
		after time.Duration
		seen  int64
		want  int64
	}{
		{0, 2, 4},                // not settled: closed for less than 3 heartbeats
		{5 * time.Second, 2, 4},  // settled, the lower count just began
		{24 * time.Second, 3, 4}, // held 29 s
		{2 * time.Second, 2, 3},  // held 31 s: falls to the highest seen, 3
		{time.Second, 6, 6},      // a rise is taken at once
		{time.Second, 5, 6},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		l.setInstances(s.seen)
		if got := l.instances.Load(); got != s.want {
			t.Fatalf("step %d (+%v, saw %d): instances %d, want %d", i, s.after, s.seen, got, s.want)
		}
	}
}

// stubStore is a store that is never reached.
type stubStore struct{}

func (stubStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return nil, core.ErrStoreUnavailable
}

// TestReplayedGrantsKept: a key keeps at most maxReplayed of the grants its
// replays applied, the newest; a restore takes them while the known state
// is older than the replay, and a confirmed reply after the replay drops
// them.
func TestReplayedGrantsKept(t *testing.T) {
	p, _ := tokenbucket.Policy("kept", 10, 1)
	var ks keyState
	var grants []driver.Grant
	for i := range maxReplayed + 10 {
		grants = append(grants, driver.Grant{Cost: 1, At: int64(1000 + i)})
	}
	ks.addReplayed(p, grants[:10], 5000, 5000)
	ks.addReplayed(p, grants[10:], 6000, 6000)
	got := ks.replayedSince(p, 7000)
	if len(got) != maxReplayed || got[0].At != 1010 || got[len(got)-1].At != int64(1000+maxReplayed+9) {
		t.Fatalf("kept %d grants from %v to %v, want the newest %d", len(got), got[0].At, got[len(got)-1].At, maxReplayed)
	}
	ks.known = known{seed: driver.Seed{Value: 1, At: 6500}, at: 6500}
	if got := ks.replayedSince(p, 7000); got != nil {
		t.Fatalf("a known state after the replay: %d grants to restore, want none", len(got))
	}
	ks.known.at = 5500
	if got := ks.replayedSince(p, 7000); len(got) != maxReplayed {
		t.Fatalf("a known state before the replay: %d grants to restore, want %d", len(got), maxReplayed)
	}
	ks.known = known{seed: driver.Seed{Value: 1, At: 6500}, at: 6500}
	ks.confirm(6600, driver.Reply{})
	if ks.replayed != nil {
		t.Fatal("a confirmed reply after the replay left the grants kept")
	}
}

// decideLease is keyState.decideLease with its reply returned.
func decideLease(k *keyState, p core.Policy, n, now, cost int64) driver.Reply {
	var r driver.Reply
	k.decideLease(p, n, now, cost, &r)
	return r
}

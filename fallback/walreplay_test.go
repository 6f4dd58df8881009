package fallback_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// dyingStore passes calls to a store; the first replay call it sees is
// applied in Redis, and then the process "dies": die runs (the journal is
// lost as a SIGKILL loses it) and the call fails as a reply lost on the
// way would.
type dyingStore struct {
	driver.Store
	once sync.Once
	die  func()
	died chan struct{}
}

func (s *dyingStore) Run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	r, err := s.Store.Run(ctx, sc, keys, args)
	if err == nil && strings.HasPrefix(sc.Name(), "reconcile") {
		dead := false
		s.once.Do(func() {
			s.die()
			close(s.died)
			dead = true
		})
		if dead {
			return nil, fmt.Errorf("%w: the instance died before the reply", core.ErrStoreUnavailable)
		}
	}
	return r, err
}

// TestCrashMidReplayCountsOnce: an instance killed after Redis applied its
// outage log's replay, and before its journal's next flush, comes back
// with the batches sealed under the ids Redis marked (the journal writes
// the seals before the batches are sent), so its second replay adds
// nothing: the bucket holds its grants once. Before the write-ahead point,
// the journal still held them as open grants, which the restart sealed
// under new ids and replayed again: the bucket held them twice (the demo's
// SIGKILL_in_recovery run admitted 0.93 of its bound, against 0.99).
func TestCrashMidReplayCountsOnce(t *testing.T) {
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			srv := redistest.Start(t)
			store := newStore(t, backend, srv.URL())
			p, _ := tokenbucket.Policy("tb", 100, 1.0/3600) // no refill in the test
			dir := t.TempDir()
			open := func(s driver.Store) *fallback.Limiter {
				l, err := fallback.New(s, fallback.Options{
					ID: "wal", ExpectedInstances: 1, StateDir: dir, StateFlush: 10 * time.Millisecond,
					Breaker: fallback.BreakerOptions{Start: fallback.Open, CallTimeout: 500 * time.Millisecond, ProbeInterval: 300 * time.Millisecond, Jitter: time.Nanosecond},
					Logger:  testLogger(),
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				return l
			}
			dying := &dyingStore{Store: store, died: make(chan struct{})}
			l1 := open(dying)
			dying.die = l1.AbandonJournal
			const granted = 10
			for i := range granted {
				r, err := l1.Allow(context.Background(), p, "k")
				if err != nil || !r.Allowed || !r.Degraded {
					t.Fatalf("grant %d: %+v %v; want admitted from the lease", i, r, err)
				}
			}
			select {
			case <-dying.died:
			case <-time.After(10 * time.Second):
				t.Fatal("the instance never replayed its outage log")
			}
			l1.Crash()

			l2 := open(store)
			defer l2.Close()
			got := fallback.RestoredFromJournal(l2)
			t.Logf("restored: %+v", got)
			if got.SealedBatches == 0 || got.OpenGrants != 0 {
				t.Errorf("restored %d sealed batches and %d open grants, want the replayed grants sealed (their ids are what Redis marked)", got.SealedBatches, got.OpenGrants)
			}
			for end := time.Now().Add(20 * time.Second); l2.Status().Breaker != "closed" || l2.Status().PendingLog != 0; {
				if time.Now().After(end) {
					t.Fatalf("the restarted instance never reconciled: %+v", l2.Status())
				}
				time.Sleep(20 * time.Millisecond)
			}
			l, err := core.NewLimiter(store, core.Options{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := l.Peek(context.Background(), p, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			// Peek answers as a request of cost 1 would: admitted, with
			// one token fewer left.
			if want := int64(100 - granted - 1); !r.Allowed || r.Remaining != want {
				t.Errorf("a request after %d grants replayed by an instance killed mid-replay leaves %d tokens, want %d (each grant counted once)", granted, r.Remaining, want)
			}
		})
	}
}

package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// keyer is a store that sends decisions on distinct keys together in calls
// of several keys (pipeline.Decisions.Depth); the backends export it.
type keyer interface {
	KeysStats() (calls, decisions int64)
}

// testKeys: many callers on many keys of buckets that do not refill within
// the test, on a store that shares calls between keys, admit on each key
// exactly its capacity or its attempts, whichever is fewer, through calls
// that carried several keys' decisions; a key of the wrong type among them
// fails its own decisions alone, with Redis's error, not an outage, and is
// left as it was.
func testKeys(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), StoreOptions{Relaxed: true, KeysDepth: 2, KeysFrom: 1})
	ks, ok := s.(keyer)
	if !ok {
		t.Fatalf("%T does not report calls of several keys", s)
	}
	l, err := core.NewLimiter(s, core.Options{Prefix: "keys:"})
	if err != nil {
		t.Fatal(err)
	}
	const capacity, nkeys, workers, each = 4, 150, 48, 25 // 1200 attempts, 8 a key
	p, err := tokenbucket.Policy("tb", capacity, 1.0/3600)
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "RPUSH", "keys:{tb:wrong}", "a", "b")
	var attempts, admitted [nkeys]atomic.Int64
	var wrongErrs atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if (w+i)%40 == 0 {
					_, err := l.AllowN(ctx, p, "wrong", 1)
					cancel()
					switch {
					case err == nil:
						errs <- errors.New("a decision on a list key was decided")
					case errors.Is(err, driver.ErrStoreUnavailable):
						errs <- fmt.Errorf("a list key's error is an outage: %w", err)
					default:
						wrongErrs.Add(1)
					}
					continue
				}
				k := (w*31 + i*7) % nkeys
				attempts[k].Add(1)
				r, err := l.AllowN(ctx, p, fmt.Sprintf("k%d", k), 1)
				cancel()
				switch {
				case err != nil:
					errs <- err
				case r.Allowed:
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := int64(0)
	for k := range nkeys {
		want := min(attempts[k].Load(), capacity)
		if got := admitted[k].Load(); got != want {
			t.Errorf("key k%d admitted %d of %d attempts, want %d (capacity %d)", k, got, attempts[k].Load(), want, capacity)
		}
		total += admitted[k].Load()
	}
	if wrongErrs.Load() == 0 {
		t.Error("no decision on the list key was made")
	}
	if got := srv.Do(t, "TYPE", "keys:{tb:wrong}"); got != "list" {
		t.Errorf("the list key is now of type %q", got)
	}
	calls, decisions := ks.KeysStats()
	t.Logf("%d admitted; %d calls of several keys carried %d decisions", total, calls, decisions)
	if calls == 0 || decisions < 2*calls {
		t.Errorf("%d calls of several keys carried %d decisions: callers on distinct keys did not share calls", calls, decisions)
	}
}

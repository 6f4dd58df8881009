package fallback_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

// shardedStore is a healthy two-shard cluster whose slot map leaves a gap
// (uncovered) or not; it answers every script with the reply a membership
// heartbeat expects and counts the calls on each key.
type shardedStore struct {
	uncovered bool
	mu        sync.Mutex
	calls     map[string]int
}

func (s *shardedStore) Run(_ context.Context, _ *driver.Script, keys, _ []string) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(keys) > 0 {
		s.calls[keys[0]]++
	}
	if len(keys) > 0 && strings.HasSuffix(keys[0], ":epoch") {
		// The epoch, a data generation one higher each read, never
		// renewed.
		return []int64{1, time.Now().UnixMicro(), int64(s.calls[keys[0]]), 0}, nil
	}
	return []int64{1, time.Now().UnixMicro()}, nil
}

func (s *shardedStore) Shards(context.Context) ([]driver.Shard, error) {
	end := driver.SlotCount - 1
	if s.uncovered {
		end -= 100
	}
	return []driver.Shard{
		{ID: "a", Slots: []driver.SlotRange{{Start: 0, End: 8191}}},
		{ID: "b", Slots: []driver.SlotRange{{Start: 8192, End: end}}},
	}, nil
}

// The whole-store limiter stops its membership heartbeat once shard cells
// decide every key, and keeps it while some slots have no shard: it still
// decides their keys, with its own instance count.
func TestWholeStoreHeartbeatWhileSlotsUncovered(t *testing.T) {
	t.Parallel()
	for _, uncovered := range []bool{false, true} {
		s := &shardedStore{uncovered: uncovered, calls: map[string]int{}}
		l, err := fallback.New(s, fallback.Options{
			ID: "a", Prefix: "hf:", Heartbeat: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); len(l.Status().Shards) != 2; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("shard cells not installed")
			}
		}
		s.mu.Lock()
		before := s.calls["hf:{members}"]
		s.mu.Unlock()
		time.Sleep(200 * time.Millisecond) // ten heartbeats
		s.mu.Lock()
		whole, cells := s.calls["hf:{members}"]-before, 0
		for k, n := range s.calls {
			if strings.HasSuffix(k, "}members") && k != "hf:{members}" {
				cells += n
			}
		}
		s.mu.Unlock()
		_ = l.Close()
		switch {
		case cells == 0:
			t.Errorf("uncovered=%v: the cells sent no heartbeat", uncovered)
		case !uncovered && whole != 0:
			t.Errorf("every slot covered: the whole-store limiter sent %d heartbeats in 200 ms, want none", whole)
		case uncovered && whole < 3:
			t.Errorf("slots uncovered: the whole-store limiter sent %d heartbeats in 200 ms (one each 20 ms), want it to keep them", whole)
		}
	}
}

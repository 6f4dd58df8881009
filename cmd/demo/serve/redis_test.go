package serve

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// fakeStore answers every call with its name.
type fakeStore struct{ shards []driver.Shard }

func (fakeStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return []int64{1, 2, 3, 4, 5}, nil
}
func (fakeStore) Ping(context.Context) error { return nil }
func (fakeStore) RunMany(_ context.Context, calls []driver.Call) []driver.CallResult {
	return make([]driver.CallResult, len(calls))
}
func (fakeStore) RunCommands(_ context.Context, cmds [][]string) []error {
	return make([]error, len(cmds))
}
func (f fakeStore) Shards(context.Context) ([]driver.Shard, error) { return f.shards, nil }

// TestConnectingStore: until the dial succeeds every call fails with
// core.ErrStoreUnavailable naming the target and the dial's error; then the
// calls reach the dialled store; Close closes its client once.
func TestConnectingStore(t *testing.T) {
	var fails atomic.Int32
	fails.Store(2)
	var closed atomic.Int32
	dial := func() (shardedStore, func(), error) {
		if fails.Add(-1) >= 0 {
			return nil, nil, errors.New("dial tcp 127.0.0.1:1: connection refused")
		}
		return fakeStore{shards: []driver.Shard{{ID: "a"}, {ID: "b"}}}, func() { closed.Add(1) }, nil
	}
	s := newConnectingStore(context.Background(), "Redis Cluster seeds 127.0.0.1:1", dial, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	sc := driver.NewScript("x", "return 1", nil)
	_, err := s.Run(ctx, sc, []string{"k"}, nil)
	if !errors.Is(err, core.ErrStoreUnavailable) || !strings.Contains(err.Error(), "not connected to Redis Cluster seeds 127.0.0.1:1 yet") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Run before connecting: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Errorf("Ping before connecting: %v", err)
	}
	if res := s.RunMany(ctx, make([]driver.Call, 2)); len(res) != 2 || !errors.Is(res[1].Err, core.ErrStoreUnavailable) {
		t.Errorf("RunMany before connecting: %v", res)
	}
	if errs := s.RunCommands(ctx, make([][]string, 2)); len(errs) != 2 || !errors.Is(errs[1], core.ErrStoreUnavailable) {
		t.Errorf("RunCommands before connecting: %v", errs)
	}
	if _, err := s.Shards(ctx); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Errorf("Shards before connecting: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatal("not connected after 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r, err := s.Run(ctx, sc, []string{"k"}, nil); err != nil || len(r) != 5 {
		t.Errorf("Run once connected: %v %v", r, err)
	}
	if sh, err := s.Shards(ctx); err != nil || len(sh) != 2 {
		t.Errorf("Shards once connected: %v %v", sh, err)
	}
	if res := s.RunMany(ctx, make([]driver.Call, 3)); len(res) != 3 || res[0].Err != nil {
		t.Errorf("RunMany once connected: %v", res)
	}
	if errs := s.RunCommands(ctx, make([][]string, 3)); len(errs) != 3 || errs[0] != nil {
		t.Errorf("RunCommands once connected: %v", errs)
	}
	s.Close()
	s.Close()
	if n := closed.Load(); n != 1 {
		t.Errorf("client closed %d times, want 1", n)
	}
}

// TestConnectingStoreCloseStopsDialling: Close ends the background loop of
// a store that never connects, promptly.
func TestConnectingStoreCloseStopsDialling(t *testing.T) {
	var dials atomic.Int32
	dial := func() (shardedStore, func(), error) {
		dials.Add(1)
		return nil, nil, errors.New("refused")
	}
	s := newConnectingStore(context.Background(), "x", dial, 10*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	n := dials.Load()
	time.Sleep(50 * time.Millisecond)
	if dials.Load() != n || n < 2 {
		t.Errorf("dials %d then %d: want retries before Close and none after", n, dials.Load())
	}
}

package slidingwindow_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/internal/redistest"
)

// TestOutOfMemoryRefusesWhole: past maxmemory Redis refuses a decision
// whole, the single script and the Many script alike, even on a window
// whose trim would remove a member (a trim frees memory, so Redis lets it
// through past maxmemory, and a script checked at each write would then
// be let through for its ZADD too: admitted through an OOM Redis). The
// window is left as it was, its expired member included.
func TestOutOfMemoryRefusesWhole(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	ctx := context.Background()
	tm, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	const w = 1_000_000
	old := strconv.FormatInt(tm.UnixMicro()-3*w, 10)
	single, many := slidingwindow.Algorithm.Script(), slidingwindow.Algorithm.Script().Many()
	for _, c := range []struct {
		name string
		src  string
		args []any
	}{
		{"single", single.Source(), []any{"10", strconv.Itoa(w), "1", "req-1"}},
		{"many", many.Script.Source(), []any{"10", strconv.Itoa(w), "1", "req-1", "", "1", "req-2", ""}},
	} {
		key := "hf:{sw:oom-" + c.name + "}"
		if err := rc.ZAdd(ctx, key, redis.Z{Score: float64(tm.UnixMicro() - 3*w), Member: "expired"}).Err(); err != nil {
			t.Fatal(err)
		}
		undo := srv.OutOfMemory(t)
		v, err := rc.Eval(ctx, c.src, []string{key}, c.args...).Result()
		undo()
		if err == nil || !strings.HasPrefix(err.Error(), "OOM") {
			t.Fatalf("%s: a decision past maxmemory replied %v, %v; want an OOM refusal", c.name, v, err)
		}
		if got, _ := rc.ZRangeWithScores(ctx, key, 0, -1).Result(); len(got) != 1 || got[0].Member != "expired" || strconv.FormatFloat(got[0].Score, 'f', 0, 64) != old {
			t.Fatalf("%s: the window after the refusal holds %v, want the expired member alone", c.name, got)
		}
	}
}

package slidingwindow_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// TestManyIsSingleProperty: the Many script decides each of its decisions
// as the single script decides them one after another at the call's
// instant (given as its "now"), on a twin of the log: the same replies
// and the same log left behind, ids repeated within a call included; a
// decision past its deadline is refused, undecided.
func TestManyIsSingleProperty(t *testing.T) {
	t.Parallel()
	m := slidingwindow.Algorithm.Script().Many()
	if m == nil || m.Shared != 2 || m.Each != 2 {
		t.Fatalf("sliding window Many %+v, want 2 shared arguments (L, W) and 2 each (cost, id)", m)
	}
	single := slidingwindow.Algorithm.Script()
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	ctx := context.Background()
	seq := 0
	rapid.Check(t, func(rt *rapid.T) {
		seq++
		a, b := "a:"+strconv.Itoa(seq), "b:"+strconv.Itoa(seq)
		tm, err := rc.Time(ctx).Result()
		if err != nil {
			rt.Fatal(err)
		}
		now := tm.UnixMicro()
		l := rapid.Int64Range(1, 20).Draw(rt, "limit")
		w := rapid.Int64Range(200_000, 5_000_000).Draw(rt, "window_us") // keys that outlive the test
		for i := range rapid.IntRange(0, int(2*l)).Draw(rt, "seeded") {
			z := redis.Z{Score: float64(now - rapid.Int64Range(0, 2*w).Draw(rt, "age")), Member: "s" + strconv.Itoa(i)}
			rc.ZAdd(ctx, a, z)
			rc.ZAdd(ctx, b, z)
		}
		n := rapid.IntRange(1, 12).Draw(rt, "decisions")
		args := []string{strconv.FormatInt(l, 10), strconv.FormatInt(w, 10)}
		type dec struct {
			cost  int64
			id    string
			stale bool
		}
		decs := make([]dec, n)
		for i := range decs {
			d := dec{cost: rapid.Int64Range(1, l).Draw(rt, "cost"), id: "r" + strconv.Itoa(rapid.IntRange(0, 5).Draw(rt, "id"))}
			dl := ""
			switch rapid.IntRange(0, 2).Draw(rt, "deadline") {
			case 1:
				dl = driver.DeadlineArg(now + 60_000_000)
			case 2:
				dl, d.stale = driver.DeadlineArg(now-1), true
			}
			decs[i] = d
			args = append(args, strconv.FormatInt(d.cost, 10), d.id, dl)
		}
		reply := evalInts(rt, rc, m.Script, a, args)
		if len(reply) != driver.ManyStride*n {
			rt.Fatalf("%d integers for %d decisions", len(reply), n)
		}
		at := int64(0)
		for i, d := range decs {
			if !d.stale {
				at = reply[driver.ManyStride*i+driver.ManyStride-1]
				break
			}
		}
		for i, d := range decs {
			got := reply[driver.ManyStride*i : driver.ManyStride*(i+1)]
			if d.stale {
				if got[0] != driver.ManyStale {
					rt.Fatalf("decision %d past its deadline: %v, want status driver.ManyStale", i, got)
				}
				continue
			}
			want := evalInts(rt, rc, single, b, []string{args[0], args[1], strconv.FormatInt(d.cost, 10), d.id, strconv.FormatInt(at, 10)})
			if got[0] != 0 || !slices.Equal(got[1:], want) {
				rt.Fatalf("decision %d (cost %d, id %s): %v, want 0 %v", i, d.cost, d.id, got, want)
			}
		}
		// What the window holds: a call whose decisions were all past
		// their deadlines may have trimmed units already outside it.
		tm, err = rc.Time(ctx).Result()
		if err != nil {
			rt.Fatal(err)
		}
		in := &redis.ZRangeBy{Min: "(" + strconv.FormatInt(tm.UnixMicro()-w, 10), Max: "+inf"}
		la, _ := rc.ZRangeByScoreWithScores(ctx, a, in).Result()
		lb, _ := rc.ZRangeByScoreWithScores(ctx, b, in).Result()
		if !slices.Equal(la, lb) {
			rt.Fatalf("log %v, want %v", la, lb)
		}
	})
}

// evalInts runs sc on key with args and returns its integer reply.
func evalInts(t *rapid.T, rc *redis.Client, sc *driver.Script, key string, args []string) []int64 {
	argv := make([]any, len(args))
	for i := range args {
		argv[i] = args[i]
	}
	v, err := rc.Eval(context.Background(), sc.Source(), []string{key}, argv...).Result()
	if err != nil {
		t.Fatal(err)
	}
	arr, _ := v.([]any)
	out := make([]int64, len(arr))
	for i, e := range arr {
		out[i], _ = e.(int64)
	}
	return out
}

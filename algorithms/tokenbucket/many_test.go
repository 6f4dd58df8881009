package tokenbucket_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// TestManyIsModelProperty: the Many script, on Redis, decides each of its
// decisions as the Go twin decides them one after another at the call's
// instant: the same replies, the same bucket left behind, and a decision
// past its deadline refused, undecided. Buckets start fresh, partly spent
// or in debt.
func TestManyIsModelProperty(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	m := tokenbucket.Algorithm.Script().Many()
	if m == nil || m.Shared != 2 || m.Each != 1 {
		t.Fatalf("token bucket Many %+v, want 2 shared arguments (C, T) and 1 each (the cost)", m)
	}
	ctx := context.Background()
	seq := 0
	rapid.Check(t, func(rt *rapid.T) {
		seq++
		key := "many:" + strconv.Itoa(seq)
		c := rapid.Int64Range(1, 50).Draw(rt, "capacity")
		tu := rapid.Int64Range(1, 2_000_000).Draw(rt, "interval_us")
		full := c * tu
		tm, err := rc.Time(ctx).Result()
		if err != nil {
			rt.Fatal(err)
		}
		now := tm.UnixMicro()
		if rapid.Bool().Draw(rt, "seeded") {
			// E from a full bucket's refill behind now to a debt ahead.
			e := now - full + rapid.Int64Range(0, 2*full).Draw(rt, "seed")
			if err := rc.Set(ctx, key, strconv.FormatInt(e, 10), time.Minute).Err(); err != nil {
				rt.Fatal(err)
			}
		}
		n := rapid.IntRange(1, 20).Draw(rt, "decisions")
		args := []string{strconv.FormatInt(c, 10), strconv.FormatInt(tu, 10)}
		costs, stale := make([]int64, n), make([]bool, n)
		for i := range n {
			costs[i] = rapid.Int64Range(1, c).Draw(rt, "cost")
			d := ""
			switch rapid.IntRange(0, 2).Draw(rt, "deadline") {
			case 1:
				d = driver.DeadlineArg(now + 60_000_000)
			case 2:
				d, stale[i] = driver.DeadlineArg(now-1), true
			}
			args = append(args, strconv.FormatInt(costs[i], 10), d)
		}
		before := get(rt, rc, key)
		reply, err := store.Run(ctx, m.Script, []string{key}, args)
		if err != nil {
			rt.Fatal(err)
		}
		if len(reply) != 6*n {
			rt.Fatalf("%d integers for %d decisions", len(reply), n)
		}
		at := reply[5]
		for i := range n {
			if !stale[i] {
				at = reply[6*i+5]
				break
			}
		}
		// The model: the bucket as GET found it, at the call's instant.
		var st tokenbucket.State
		ok := before != ""
		if ok {
			e, err := strconv.ParseInt(before, 10, 64)
			if err != nil {
				rt.Fatal(err)
			}
			st = tokenbucket.FromEmpty(e, at, full)
		}
		spent := false
		for i := range n {
			got := reply[6*i : 6*i+6]
			if stale[i] {
				if got[0] != 1 {
					rt.Fatalf("decision %d past its deadline: %v, want status 1", i, got)
				}
				continue
			}
			next, changed, want := tokenbucket.Decide(st, ok, at, c, tu, costs[i])
			if got[0] != 0 || [driver.ReplyLen]int64(got[1:]) != want {
				rt.Fatalf("decision %d (cost %d): %v, want 0 %v", i, costs[i], got, want)
			}
			if changed {
				st, ok, spent = next, true, true
			}
		}
		after := get(rt, rc, key)
		switch {
		case spent && after != strconv.FormatInt(st.Empty(), 10):
			rt.Fatalf("bucket left %q, want E %d", after, st.Empty())
		case !spent && after != before:
			rt.Fatalf("nothing admitted, yet the bucket went from %q to %q", before, after)
		}
	})
}

// TestManyErrors: a Many call on a key of another type, or with a cost
// out of range, fails as a whole and writes nothing.
func TestManyErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	m := tokenbucket.Algorithm.Script().Many()
	ctx := context.Background()
	srv.Do(t, "RPUSH", "list", "x")
	if _, err := store.Run(ctx, m.Script, []string{"list"}, []string{"5", "1000", "1", "", "1", ""}); !errors.Is(err, core.ErrWrongType) {
		t.Errorf("on a list: %v, want ErrWrongType", err)
	}
	for _, args := range [][]string{
		{"5", "1000", "1", "", "6", ""}, // cost above capacity
		{"5", "1000", "0", ""},
		{"5", "x", "1", ""},
	} {
		if _, err := store.Run(ctx, m.Script, []string{"k"}, args); err == nil {
			t.Errorf("args %q: no error", args)
		}
		if v := srv.Do(t, "EXISTS", "k"); v != "0" {
			t.Errorf("args %q: the bucket was written", args)
		}
	}
}

// get is key's string value, "" when it holds nothing.
func get(t *rapid.T, rc *redis.Client, key string) string {
	v, err := rc.Get(context.Background(), key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

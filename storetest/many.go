package storetest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// A ManyModel is the Go twin of a Many call on one key: the decisions of
// the single script, one after another, at the call's instant.
type ManyModel interface {
	// Decide returns the reply the single script gives a decision of cost
	// n, and keeps its effect.
	Decide(n int64) [driver.ReplyLen]int64
	// Stored returns what the key must hold after the decisions, and
	// whether they changed it.
	Stored() (string, bool)
}

// A ManyCase is an algorithm's Many under CheckMany.
type ManyCase struct {
	Many *driver.Many
	// Draw draws a policy: the Many's shared arguments, the largest cost,
	// and what the key holds first ("" for nothing), given Redis time now.
	Draw func(rt *rapid.T, now int64) (shared []string, maxCost int64, seed string)
	// Model is the twin of the key holding before ("" for nothing) at the
	// call's instant at.
	Model func(before string, at int64, shared []string) (ManyModel, error)
}

// CheckMany checks that a Many call on Redis decides each of its
// decisions as the single script would in order at the call's instant:
// the same replies, the same key left behind, and a decision past its
// deadline refused, undecided (status 1), whatever its place.
func CheckMany(t *testing.T, c ManyCase) {
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	ctx := context.Background()
	seq := 0
	rapid.Check(t, func(rt *rapid.T) {
		seq++
		key := "many:" + strconv.Itoa(seq)
		tm, err := rc.Time(ctx).Result()
		if err != nil {
			rt.Fatal(err)
		}
		now := tm.UnixMicro()
		shared, maxCost, seed := c.Draw(rt, now)
		if seed != "" {
			if err := rc.Set(ctx, key, seed, time.Minute).Err(); err != nil {
				rt.Fatal(err)
			}
		}
		n := rapid.IntRange(1, 20).Draw(rt, "decisions")
		args := append([]string(nil), shared...)
		costs, stale := make([]int64, n), make([]bool, n)
		for i := range n {
			costs[i] = rapid.Int64Range(1, maxCost).Draw(rt, "cost")
			d := ""
			switch rapid.IntRange(0, 2).Draw(rt, "deadline") {
			case 1:
				d = driver.DeadlineArg(now + 60_000_000)
			case 2:
				d, stale[i] = driver.DeadlineArg(now-1), true
			}
			args = append(args, strconv.FormatInt(costs[i], 10), d)
		}
		before := getString(rt, rc, key)
		v, err := rc.EvalSha(ctx, c.Many.Script.SHA1(), []string{key}, toAny(args)...).Result()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = rc.Eval(ctx, c.Many.Script.Source(), []string{key}, toAny(args)...).Result()
		}
		if err != nil {
			rt.Fatal(err)
		}
		arr, _ := v.([]any)
		if len(arr) != driver.ManyStride*n {
			rt.Fatalf("reply %v for %d decisions, want %d integers", v, n, driver.ManyStride*n)
		}
		reply := make([]int64, len(arr))
		for i, e := range arr {
			reply[i], _ = e.(int64)
		}
		at := int64(0)
		for i := range n {
			if !stale[i] {
				at = reply[driver.ManyStride*i+driver.ManyStride-1]
				break
			}
		}
		m, err := c.Model(before, at, shared)
		if err != nil {
			rt.Fatal(err)
		}
		for i := range n {
			got := reply[driver.ManyStride*i : driver.ManyStride*(i+1)]
			if stale[i] {
				if got[0] != driver.ManyStale {
					rt.Fatalf("decision %d past its deadline: %v, want status driver.ManyStale", i, got)
				}
				continue
			}
			if want := m.Decide(costs[i]); got[0] != 0 || [driver.ReplyLen]int64(got[1:]) != want {
				rt.Fatalf("decision %d (cost %d): %v, want 0 %v", i, costs[i], got, want)
			}
		}
		after := getString(rt, rc, key)
		want, changed := m.Stored()
		switch {
		case changed && after != want:
			rt.Fatalf("key left %q, want %q", after, want)
		case !changed && after != before:
			rt.Fatalf("nothing admitted, yet the key went from %q to %q", before, after)
		}
	})
}

// getString is key's string value, "" when it holds nothing.
func getString(t *rapid.T, rc *redis.Client, key string) string {
	v, err := rc.Get(context.Background(), key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

func toAny(a []string) []any {
	out := make([]any, len(a))
	for i := range a {
		out[i] = a[i]
	}
	return out
}

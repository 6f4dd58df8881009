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
// deadline refused, undecided (status 1), whatever its place. It checks
// the Many's Keys script too: a call of up to four keys' decisions (a key
// may come twice) decides each key's as a Many call on that key alone
// would, in turn, at the call's one instant; and a key that holds the
// wrong type among them fails its decisions alone (driver.ManyAlone),
// written nothing, while the others are decided.
func CheckMany(t *testing.T, c ManyCase) {
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	ctx := context.Background()
	seq := 0
	rapid.Check(t, func(rt *rapid.T) {
		tm, err := rc.Time(ctx).Result()
		if err != nil {
			rt.Fatal(err)
		}
		now := tm.UnixMicro()
		shared, maxCost, seed := c.Draw(rt, now)
		keyed := c.Many.Keys != nil && rapid.Bool().Draw(rt, "keys")
		groups := 1
		if keyed {
			groups = rapid.IntRange(1, 4).Draw(rt, "groups")
		}
		// Each group: a key and its decisions. A group may reuse an earlier
		// group's key, or hold a key of the wrong type.
		type group struct {
			key          string
			wrong, again bool
			costs        []int64
			stale        []bool
		}
		gs := make([]group, groups)
		var keys []string
		args := append([]string(nil), shared...)
		for g := range gs {
			seq++
			gs[g].key = "many:" + strconv.Itoa(seq)
			switch {
			case keyed && g > 0 && rapid.IntRange(0, 3).Draw(rt, "reuse") == 0:
				gs[g].key, gs[g].again = gs[rapid.IntRange(0, g-1).Draw(rt, "reused")].key, true
			case keyed && rapid.IntRange(0, 5).Draw(rt, "wrongtype") == 0:
				gs[g].wrong = true
				if err := rc.RPush(ctx, gs[g].key, "x").Err(); err != nil {
					rt.Fatal(err)
				}
			case g == 0 && seed != "":
				if err := rc.Set(ctx, gs[g].key, seed, time.Minute).Err(); err != nil {
					rt.Fatal(err)
				}
			}
			for _, p := range gs[:g] {
				if p.key == gs[g].key {
					gs[g].wrong = p.wrong
				}
			}
			n := rapid.IntRange(1, 20).Draw(rt, "decisions")
			if keyed {
				args = append(args, strconv.Itoa(n))
			}
			gs[g].costs, gs[g].stale = make([]int64, n), make([]bool, n)
			for i := range n {
				gs[g].costs[i] = rapid.Int64Range(1, maxCost).Draw(rt, "cost")
				d := ""
				switch rapid.IntRange(0, 2).Draw(rt, "deadline") {
				case 1:
					d = driver.DeadlineArg(now + 60_000_000)
				case 2:
					d, gs[g].stale[i] = driver.DeadlineArg(now-1), true
				}
				args = append(args, strconv.FormatInt(gs[g].costs[i], 10), d)
			}
			keys = append(keys, gs[g].key)
		}
		befores := make(map[string]string)
		for _, g := range gs {
			if !g.wrong {
				befores[g.key] = getString(rt, rc, g.key)
			}
		}
		sc := c.Many.Script
		if keyed {
			sc = c.Many.Keys
		}
		v, err := rc.EvalSha(ctx, sc.SHA1(), keys, toAny(args)...).Result()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = rc.Eval(ctx, sc.Source(), keys, toAny(args)...).Result()
		}
		if err != nil {
			rt.Fatal(err)
		}
		arr, _ := v.([]any)
		total := 0
		for _, g := range gs {
			total += len(g.costs)
		}
		if len(arr) != driver.ManyStride*total {
			rt.Fatalf("reply %v for %d decisions, want %d integers", v, total, driver.ManyStride*total)
		}
		reply := make([]int64, len(arr))
		for i, e := range arr {
			reply[i], _ = e.(int64)
		}
		at := int64(0)
		for i := 0; i < total && at == 0; i++ {
			if reply[driver.ManyStride*i] == 0 {
				at = reply[driver.ManyStride*i+driver.ManyStride-1]
			}
		}
		models := make(map[string]ManyModel)
		o := 0
		for gi, g := range gs {
			if g.wrong {
				for i := range g.costs {
					if got := reply[driver.ManyStride*(o+i)]; got != driver.ManyAlone {
						rt.Fatalf("group %d on a list, decision %d: status %d, want driver.ManyAlone", gi, i, got)
					}
				}
				o += len(g.costs)
				continue
			}
			m := models[g.key]
			if m == nil {
				if m, err = c.Model(befores[g.key], at, shared); err != nil {
					rt.Fatal(err)
				}
				models[g.key] = m
			}
			for i := range g.costs {
				got := reply[driver.ManyStride*(o+i) : driver.ManyStride*(o+i+1)]
				if g.stale[i] {
					if got[0] != driver.ManyStale {
						rt.Fatalf("group %d, decision %d past its deadline: %v, want status driver.ManyStale", gi, i, got)
					}
					continue
				}
				if want := m.Decide(g.costs[i]); got[0] != 0 || [driver.ReplyLen]int64(got[1:]) != want {
					rt.Fatalf("group %d, decision %d (cost %d): %v, want 0 %v", gi, i, g.costs[i], got, want)
				}
			}
			o += len(g.costs)
		}
		for _, g := range gs {
			if g.wrong {
				if typ, err := rc.Type(ctx, g.key).Result(); err != nil || typ != "list" {
					rt.Fatalf("key of the wrong type left %q, %v", typ, err)
				}
				continue
			}
			if g.again {
				continue
			}
			after := getString(rt, rc, g.key)
			want, changed := models[g.key].Stored()
			switch {
			case changed && after != want:
				rt.Fatalf("key left %q, want %q", after, want)
			case !changed && after != befores[g.key]:
				rt.Fatalf("nothing admitted, yet the key went from %q to %q", befores[g.key], after)
			}
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

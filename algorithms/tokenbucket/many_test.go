package tokenbucket_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// bucketModel is a token bucket decided one decision after another at
// one instant, as many.lua must decide them.
type bucketModel struct {
	st          tokenbucket.State
	ok, changed bool
	at, c, t    int64
}

func (m *bucketModel) Decide(n int64) [driver.ReplyLen]int64 {
	next, changed, reply := tokenbucket.Decide(m.st, m.ok, m.at, m.c, m.t, n)
	if changed {
		m.st, m.ok, m.changed = next, true, true
	}
	return reply
}

func (m *bucketModel) Stored() (string, bool) {
	return strconv.FormatInt(m.st.Empty(), 10), m.changed
}

// TestManyIsModelProperty: the Many script, on Redis, decides each of its
// decisions as the Go twin decides them one after another at the call's
// instant (storetest.CheckMany). Buckets start fresh, partly spent or in
// debt.
func TestManyIsModelProperty(t *testing.T) {
	t.Parallel()
	m := tokenbucket.Algorithm.Script().Many()
	if m == nil || m.Shared != 2 || m.Each != 1 {
		t.Fatalf("token bucket Many %+v, want 2 shared arguments (C, T) and 1 each (the cost)", m)
	}
	storetest.CheckMany(t, storetest.ManyCase{
		Many: m,
		Draw: func(rt *rapid.T, now int64) ([]string, int64, string) {
			c := rapid.Int64Range(1, 50).Draw(rt, "capacity")
			tu := rapid.Int64Range(100_000, 2_000_000).Draw(rt, "interval_us") // keys that outlive the test
			seed := ""
			if rapid.Bool().Draw(rt, "seeded") {
				// E from a full bucket's refill behind now to a debt ahead.
				full := c * tu
				seed = strconv.FormatInt(now-full+rapid.Int64Range(0, 2*full).Draw(rt, "seed"), 10)
			}
			return []string{strconv.FormatInt(c, 10), strconv.FormatInt(tu, 10)}, c, seed
		},
		Model: func(before string, at int64, shared []string) (storetest.ManyModel, error) {
			c, _ := strconv.ParseInt(shared[0], 10, 64)
			tu, _ := strconv.ParseInt(shared[1], 10, 64)
			m := &bucketModel{at: at, c: c, t: tu}
			if before != "" {
				e, err := strconv.ParseInt(before, 10, 64)
				if err != nil {
					return nil, err
				}
				m.st, m.ok = tokenbucket.FromEmpty(e, at, c*tu), true
			}
			return m, nil
		},
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

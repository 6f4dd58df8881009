package slidingcounter_test

import (
	"fmt"
	"strconv"
	"testing"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

// counterModel is a counter decided one decision after another at one
// instant, as many.lua must decide them.
type counterModel struct {
	st          slidingcounter.State
	ok, changed bool
	at, l, w    int64
}

func (m *counterModel) Decide(n int64) [driver.ReplyLen]int64 {
	next, changed, reply := slidingcounter.Decide(m.st, m.ok, m.at, m.l, m.w, n)
	if changed {
		m.st, m.ok, m.changed = next, true, true
	}
	return reply
}

func (m *counterModel) Stored() (string, bool) {
	return fmt.Sprintf("%d:%d:%d", m.st.Window, m.st.Cur, m.st.Prev), m.changed
}

// TestManyIsModelProperty: the Many script, on Redis, decides each of its
// decisions as the Go twin decides them one after another at the call's
// instant (storetest.CheckMany). Counters start fresh, or in this window,
// the one before, one further back or one ahead (a clock stepped back).
func TestManyIsModelProperty(t *testing.T) {
	t.Parallel()
	m := slidingcounter.Algorithm.Script().Many()
	if m == nil || m.Shared != 2 || m.Each != 1 {
		t.Fatalf("sliding counter Many %+v, want 2 shared arguments (L, W) and 1 each (the cost)", m)
	}
	storetest.CheckMany(t, storetest.ManyCase{
		Many: m,
		Draw: func(rt *rapid.T, now int64) ([]string, int64, string) {
			l := rapid.Int64Range(1, 50).Draw(rt, "limit")
			w := rapid.Int64Range(200_000, 5_000_000).Draw(rt, "window_us") // keys that outlive the test
			seed := ""
			if rapid.Bool().Draw(rt, "seeded") {
				k := now/w + rapid.Int64Range(-2, 1).Draw(rt, "window")
				seed = fmt.Sprintf("%d:%d:%d", k, rapid.Int64Range(0, l).Draw(rt, "cur"), rapid.Int64Range(0, l).Draw(rt, "prev"))
			}
			return []string{strconv.FormatInt(l, 10), strconv.FormatInt(w, 10)}, l, seed
		},
		Model: func(before string, at int64, shared []string) (storetest.ManyModel, error) {
			l, _ := strconv.ParseInt(shared[0], 10, 64)
			w, _ := strconv.ParseInt(shared[1], 10, 64)
			m := &counterModel{at: at, l: l, w: w}
			if before != "" {
				if _, err := fmt.Sscanf(before, "%d:%d:%d", &m.st.Window, &m.st.Cur, &m.st.Prev); err != nil {
					return nil, fmt.Errorf("counter %q: %v", before, err)
				}
				m.ok = true
			}
			return m, nil
		},
	})
}

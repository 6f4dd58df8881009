package reconcile_test

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/reconcile"
)

// globalBucket is the reference: one exact bucket fed every grant of every
// instance in time order, forgiving debt beyond one full bucket after each
// grant.
func globalBucket(start tokenbucket.State, c, t int64, grants []core.Grant) tokenbucket.State {
	full := c * t
	st := start
	for _, g := range grants {
		if g.At > st.Last {
			st.Credit = min(full, st.Credit+g.At-st.Last)
			st.Last = g.At
		}
		st.Credit = max(st.Credit-g.Cost*t, -full)
	}
	return st
}

// at returns the credit of st brought forward to time now.
func at(st tokenbucket.State, full, now int64) int64 {
	if now > st.Last {
		return min(full, st.Credit+now-st.Last)
	}
	return st.Credit
}

// TestReplayNeverBeatsOneGlobalBucket: whatever the grants of each instance
// and whatever order the instances reconcile in, the stored bucket never
// holds more than one global bucket fed the same grants. The shortfall (the
// under-admission that sequential replay costs) is logged.
func TestReplayNeverBeatsOneGlobalBucket(t *testing.T) {
	var worst, total float64
	var runs int
	rapid.Check(t, func(rt *rapid.T) {
		c := rapid.Int64Range(1, 50).Draw(rt, "capacity")
		tt := rapid.Int64Range(1, 100_000).Draw(rt, "interval_us")
		full := c * tt
		start := tokenbucket.State{
			Credit: rapid.Int64Range(-full, full).Draw(rt, "start_credit"),
			Last:   1_000_000,
		}
		instances := rapid.IntRange(1, 4).Draw(rt, "instances")
		logs := make([][]core.Grant, instances)
		var all []core.Grant
		for i := range logs {
			n := rapid.IntRange(0, 20).Draw(rt, fmt.Sprint("grants", i))
			for j := range n {
				g := core.Grant{
					ID:   fmt.Sprintf("%d-%d", i, j),
					Cost: rapid.Int64Range(1, c).Draw(rt, "cost"),
					At:   rapid.Int64Range(900_000, 1_000_000+50*tt).Draw(rt, "at"),
				}
				logs[i] = append(logs[i], g)
			}
			slices.SortFunc(logs[i], func(a, b core.Grant) int { return int(a.At - b.At) })
			all = append(all, logs[i]...)
		}
		slices.SortStableFunc(all, func(a, b core.Grant) int { return int(a.At - b.At) })
		order := rapid.Permutation(seq(instances)).Draw(rt, "order")
		st, ok := start, true
		for _, i := range order {
			st = reconcile.ReplayTokenBucket(st, ok, core.Seed{}, c, tt, logs[i])
		}
		model := globalBucket(start, c, tt, all)
		end := max(st.Last, model.Last)
		got, want := at(st, full, end), at(model, full, end)
		if got > want {
			rt.Fatalf("replay leaves %d µs of credit, one global bucket %d: replay over-admits", got, want)
		}
		short := float64(want-got) / float64(tt)
		worst = max(worst, short)
		total += short
		runs++
	})
	t.Logf("under-admission against one global bucket: mean %.2f tokens, worst %.2f tokens over %d runs", total/float64(runs), worst, runs)
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestReplaySeedsAMissingKey: a key Redis lost is rebuilt from the
// instance's last known state, not from a full bucket.
func TestReplaySeedsAMissingKey(t *testing.T) {
	const c, tt = 10, 1000
	seed := core.Seed{Value: 2 * tt, At: 5000} // 2 tokens left at 5 ms
	grants := []core.Grant{{ID: "a", Cost: 1, At: 5000}, {ID: "b", Cost: 1, At: 6000}}
	st := reconcile.ReplayTokenBucket(tokenbucket.State{}, false, seed, c, tt, grants)
	// 2 tokens, -1 at 5 ms, +1 refilled by 6 ms, -1: one token left.
	if st.Credit != 1*tt || st.Last != 6000 {
		t.Fatalf("state %+v, want 1 token at 6000", st)
	}
	// Without a seed the key is a full bucket at the first grant.
	st = reconcile.ReplayTokenBucket(tokenbucket.State{}, false, core.Seed{}, c, tt, grants)
	if st.Credit != 9*tt {
		t.Fatalf("unseeded state %+v, want 9 tokens", st)
	}
}

// TestReplayDebtIsBounded: an outage that admitted three buckets' worth
// leaves a debt of one bucket, not three.
func TestReplayDebtIsBounded(t *testing.T) {
	var grants []core.Grant
	for i := range 30 {
		grants = append(grants, core.Grant{ID: fmt.Sprint(i), Cost: 1, At: 1000})
	}
	st := reconcile.ReplayTokenBucket(tokenbucket.State{Credit: 0, Last: 1000}, true, core.Seed{}, 10, 100, grants)
	if st.Credit != -10*100 {
		t.Fatalf("credit %d, want -1000 (one bucket of debt)", st.Credit)
	}
}

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
// instance in time order.
// It also reports the lowest credit the bucket reached.
func globalBucket(start tokenbucket.State, c, t int64, grants []core.Grant) (tokenbucket.State, int64) {
	full := c * t
	st := start
	low := st.Credit
	for _, g := range grants {
		if g.At > st.Last {
			st.Credit = min(full, st.Credit+g.At-st.Last)
			st.Last = g.At
		}
		st.Credit -= g.Cost * t
		low = min(low, st.Credit)
	}
	return st, low
}

// at returns the credit of st brought forward to time now.
func at(st tokenbucket.State, full, now int64) int64 {
	if now > st.Last {
		return min(full, st.Credit+now-st.Last)
	}
	return st.Credit
}

// TestReplayIsOneGlobalBucket: whatever the grants of each instance and
// whatever order the instances reconcile in, the stored bucket ends exactly
// where one global bucket fed the same grants would (its debt forgiven beyond
// one full bucket): no over-admission, and no under-admission either.
func TestReplayIsOneGlobalBucket(t *testing.T) {
	var exact, forgiven int
	rapid.Check(t, func(rt *rapid.T) {
		c := rapid.Int64Range(1, 50).Draw(rt, "capacity")
		tt := rapid.Int64Range(1, 100_000).Draw(rt, "interval_us")
		full := c * tt
		start := tokenbucket.State{
			Credit: rapid.Int64Range(0, full).Draw(rt, "start_credit"),
			Last:   1_000_000,
		}
		instances := rapid.IntRange(1, 4).Draw(rt, "instances")
		logs := make([][]core.Grant, instances)
		var all []core.Grant
		for i := range logs {
			n := rapid.IntRange(0, 12).Draw(rt, fmt.Sprint("grants", i))
			for j := range n {
				g := core.Grant{
					ID:   fmt.Sprintf("%d-%d", i, j),
					Cost: rapid.Int64Range(1, max(1, c/4)).Draw(rt, "cost"),
					At:   rapid.Int64Range(1_000_000-5*tt, 1_000_000+50*tt).Draw(rt, "at"),
				}
				logs[i] = append(logs[i], g)
			}
			slices.SortFunc(logs[i], func(a, b core.Grant) int { return int(a.At - b.At) })
			all = append(all, logs[i]...)
		}
		slices.SortStableFunc(all, func(a, b core.Grant) int { return int(a.At - b.At) })
		order := rapid.Permutation(seq(instances)).Draw(rt, "order")
		st := start
		var m reconcile.MergeLog
		for _, i := range order {
			st = reconcile.ReplayTokenBucket(st, true, core.Seed{}, &m, c, tt, logs[i])
		}
		model, low := globalBucket(start, c, tt, all)
		end := max(st.Last, model.Last)
		got, want := at(st, full, end), max(at(model, full, end), -full)
		if low >= -full && got != want {
			rt.Fatalf("replay leaves %d µs of credit, one global bucket %d", got, want)
		}
		// Beyond one bucket of debt the rest is forgiven, at each batch:
		// never harsher than the global bucket, and never above full.
		if low < -full && (got < want || got > full) {
			rt.Fatalf("debt beyond a bucket: replay %d, global %d, full %d", got, want, full)
		}
		if low >= -full {
			exact++
		} else {
			forgiven++
		}
	})
	t.Logf("equal to one global bucket in %d runs; debt beyond one bucket forgiven in %d", exact, forgiven)
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
	st := reconcile.ReplayTokenBucket(tokenbucket.State{}, false, seed, &reconcile.MergeLog{}, c, tt, grants)
	// 2 tokens, -1 at 5 ms, +1 refilled by 6 ms, -1: one token left.
	if st.Credit != 1*tt || st.Last != 6000 {
		t.Fatalf("state %+v, want 1 token at 6000", st)
	}
	// Without a seed the key is a full bucket at the first grant.
	st = reconcile.ReplayTokenBucket(tokenbucket.State{}, false, core.Seed{}, &reconcile.MergeLog{}, c, tt, grants)
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
	st := reconcile.ReplayTokenBucket(tokenbucket.State{Credit: 0, Last: 1000}, true, core.Seed{}, &reconcile.MergeLog{}, 10, 100, grants)
	if st.Credit != -10*100 {
		t.Fatalf("credit %d, want -1000 (one bucket of debt)", st.Credit)
	}
}

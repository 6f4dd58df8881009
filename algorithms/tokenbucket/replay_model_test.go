package tokenbucket_test

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core/driver"
)

// globalBucket is the reference: one exact bucket fed every grant of every
// instance in time order.
// It also reports the lowest credit the bucket reached.
func globalBucket(start tokenbucket.State, c, t int64, grants []driver.Grant) (tokenbucket.State, int64) {
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
		logs := make([][]driver.Grant, instances)
		var all []driver.Grant
		for i := range logs {
			n := rapid.IntRange(0, 12).Draw(rt, fmt.Sprint("grants", i))
			for j := range n {
				g := driver.Grant{
					ID:   fmt.Sprintf("%d-%d", i, j),
					Cost: rapid.Int64Range(1, max(1, c/4)).Draw(rt, "cost"),
					At:   rapid.Int64Range(1_000_000-5*tt, 1_000_000+50*tt).Draw(rt, "at"),
				}
				logs[i] = append(logs[i], g)
			}
			slices.SortFunc(logs[i], func(a, b driver.Grant) int { return int(a.At - b.At) })
			all = append(all, logs[i]...)
		}
		slices.SortStableFunc(all, func(a, b driver.Grant) int { return int(a.At - b.At) })
		order := rapid.Permutation(seq(instances)).Draw(rt, "order")
		// The replays run after the outage: Redis time is past every grant.
		now := 1_000_000 + 50*tt + rapid.Int64Range(0, 10*tt).Draw(rt, "replay_delay")
		e := start.Empty()
		var m tokenbucket.MergeLog
		for _, i := range order {
			e = tokenbucket.Replay(e, true, driver.Seed{}, &m, c, tt, now, logs[i])
		}
		model, low := globalBucket(start, c, tt, all)
		end := max(now, model.Last)
		got, want := min(full, end-e), max(at(model, full, end), -full)
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
	seed := driver.Seed{Value: 2 * tt, At: 5000} // 2 tokens left at 5 ms
	grants := []driver.Grant{{ID: "a", Cost: 1, At: 5000}, {ID: "b", Cost: 1, At: 6000}}
	e := tokenbucket.Replay(0, false, seed, &tokenbucket.MergeLog{}, c, tt, 6000, grants)
	// 2 tokens, -1 at 5 ms, +1 refilled by 6 ms, -1: one token left.
	if st := tokenbucket.FromEmpty(e, 6000, c*tt); st.Credit != 1*tt {
		t.Fatalf("state %+v, want 1 token at 6000", st)
	}
	// Without a seed the key is a full bucket at the first grant.
	e = tokenbucket.Replay(0, false, driver.Seed{}, &tokenbucket.MergeLog{}, c, tt, 6000, grants)
	if st := tokenbucket.FromEmpty(e, 6000, c*tt); st.Credit != 9*tt {
		t.Fatalf("unseeded state %+v, want 9 tokens", st)
	}
}

// TestReplayDebtIsBounded: an outage that admitted three buckets' worth
// leaves a debt of one bucket, not three.
func TestReplayDebtIsBounded(t *testing.T) {
	var grants []driver.Grant
	for i := range 30 {
		grants = append(grants, driver.Grant{ID: fmt.Sprint(i), Cost: 1, At: 1000})
	}
	start := tokenbucket.State{Credit: 0, Last: 1000}
	e := tokenbucket.Replay(start.Empty(), true, driver.Seed{}, &tokenbucket.MergeLog{}, 10, 100, 1000, grants)
	if st := tokenbucket.FromEmpty(e, 1000, 10*100); st.Credit != -10*100 {
		t.Fatalf("credit %d, want -1000 (one bucket of debt)", st.Credit)
	}
	// The debt is bounded at the replay's own time: replayed 500 µs later,
	// the bucket owes one bucket then, not one bucket at the grants' time.
	e = tokenbucket.Replay(start.Empty(), true, driver.Seed{}, &tokenbucket.MergeLog{}, 10, 100, 1500, grants)
	if st := tokenbucket.FromEmpty(e, 1500, 10*100); st.Credit != -10*100 {
		t.Fatalf("credit %d at 1500, want -1000 (one bucket of debt)", st.Credit)
	}
}

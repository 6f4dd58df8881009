package slidingcounter_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

func must(p core.Policy, err error) core.Policy {
	if err != nil {
		panic(err)
	}
	return p
}

// TestPolicyBounds: Limit × Window may reach MaxProduct and not pass it.
func TestPolicyBounds(t *testing.T) {
	for _, tc := range []struct {
		limit  int64
		window time.Duration
		ok     bool
	}{
		{1 << 20, 1 << 30 * time.Microsecond, true},
		{1<<20 + 1, 1 << 30 * time.Microsecond, false},
		{core.MaxLimit, time.Second, true},
		{core.MaxLimit, 2 * time.Second, false},
		{1, core.MaxInterval, true},
		{1, time.Microsecond, true},
	} {
		p, err := slidingcounter.Policy("sc", tc.limit, tc.window)
		if tc.ok != (err == nil) {
			t.Errorf("Policy(%d, %v): %v, want ok %v", tc.limit, tc.window, err, tc.ok)
		}
		if err != nil && !errors.Is(err, core.ErrInvalidPolicy) {
			t.Errorf("Policy(%d, %v): %v, want ErrInvalidPolicy", tc.limit, tc.window, err)
		}
		if err == nil && (p.Algorithm().Name() != slidingcounter.Name || p.Algorithm().NeedsID()) {
			t.Errorf("Policy(%d, %v) = %v", tc.limit, tc.window, p)
		}
	}
}

// TestArgs: ARGV is L, W in microseconds, the cost and, when given, now.
func TestArgs(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 7, 1500*time.Millisecond))
	if got := fmt.Sprint(p.Algorithm().Args(p, 2, "ignored", 0)); got != "[7 1500000 2]" {
		t.Errorf("Args without now = %s", got)
	}
	if got := fmt.Sprint(p.Algorithm().Args(p, 2, "", 42)); got != "[7 1500000 2 42]" {
		t.Errorf("Args with now = %s", got)
	}
}

// TestLocalRejectsBadArgs: the Go twin refuses what the script refuses.
func TestLocalRejectsBadArgs(t *testing.T) {
	f := slidingcounter.Algorithm.Script().Local()
	for _, args := range [][]string{
		nil, {"1", "2"}, {"1", "2", "3", "4", "5"}, {"x", "1", "1"}, {"0", "1", "1"},
		{"3", "0", "1"}, {"3", "1", "0"}, {"3", "1", "4"}, {"3", "1", "1", "1.5"},
	} {
		if _, _, _, err := f(nil, storetest.T0, args); !errors.Is(err, core.ErrInvalidPolicy) {
			t.Errorf("args %q: %v, want ErrInvalidPolicy", args, err)
		}
	}
}

// TestCounterInvariants: for any traffic on one key, with the clock moving
// forward, the counter holds exactly the units admitted in the current
// fixed window and the one before it; so no fixed window ever admits more
// than the limit, and the estimate never drops below the current window's
// true count. The reply's remaining is the limit less the estimate, and a
// state read at or after the end of its next window (when its key has
// expired) decides as no state at all.
func TestCounterInvariants(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		lim := rapid.Int64Range(1, 20).Draw(rt, "limit")
		w := rapid.SampledFrom([]int64{1, 7, 1000, 333_333, 1_000_000}).Draw(rt, "window_us")
		now := storetest.T0 + rapid.Int64Range(0, w).Draw(rt, "phase")
		perWindow := map[int64]int64{}
		var st slidingcounter.State
		var ok bool
		for i := range rapid.IntRange(1, 200).Draw(rt, "steps") {
			now += rapid.SampledFrom([]int64{0, 1, w / 3, w / 2, w, 2 * w, 3 * w}).Draw(rt, fmt.Sprint("pause", i))
			cost := rapid.Int64Range(1, lim).Draw(rt, fmt.Sprint("cost", i))
			if ok && now >= (st.Window+2)*w {
				_, _, fresh := slidingcounter.Decide(slidingcounter.State{}, false, now, lim, w, cost)
				if _, _, got := slidingcounter.Decide(st, true, now, lim, w, cost); got != fresh {
					rt.Fatalf("step %d: expired state %+v decides %v, no state %v", i, st, got, fresh)
				}
			}
			next, changed, r := slidingcounter.Decide(st, ok, now, lim, w, cost)
			if changed {
				st, ok = next, true
				perWindow[now/w] += cost
			}
			j := now / w
			if perWindow[j] > lim {
				rt.Fatalf("step %d: window %d admitted %d, limit %d", i, j, perWindow[j], lim)
			}
			rolled := st.Roll(j)
			if ok && (rolled.Cur != perWindow[j] || rolled.Prev != perWindow[j-1]) {
				rt.Fatalf("step %d: state %+v rolled to window %d is %+v, admitted %d then %d", i, st, j, rolled, perWindow[j-1], perWindow[j])
			}
			est := st.Estimate(now, w)
			if est < perWindow[j] {
				rt.Fatalf("step %d: estimate %d below the window's count %d", i, est, perWindow[j])
			}
			if want := max(lim-est, 0); ok && r[1] != want {
				rt.Fatalf("step %d: remaining %d, limit - estimate %d", i, r[1], want)
			}
			if _, err := driver.ParseReply(r[:]); err != nil {
				rt.Fatalf("step %d: %v", i, err)
			}
		}
	})
}

// TestStepMatchesLocal: the typed twin (Step, on a state updated in place)
// and the string one (the script's LocalFunc) give the same replies and
// key lifetimes on the same requests, and a key lives until its state reads
// as empty.
func TestStepMatchesLocal(t *testing.T) {
	alg := slidingcounter.Algorithm.(driver.DirectAlgorithm)
	f := alg.Script().Local()
	rapid.Check(t, func(rt *rapid.T) {
		lim := rapid.Int64Range(1, 8).Draw(rt, "limit")
		w := rapid.SampledFrom([]time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second}).Draw(rt, "window")
		p := must(slidingcounter.Policy("sc", lim, w))
		now := storetest.T0
		var typed, str any
		var typedExp, strExp int64
		for i := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			now += rapid.Int64Range(0, 3*w.Microseconds()).Draw(rt, fmt.Sprint("pause", i))
			cost := rapid.Int64Range(1, lim).Draw(rt, fmt.Sprint("cost", i))
			next, r, ttl := alg.Step(p, typed, typed != nil && now < typedExp, now, cost)
			if ttl <= 0 {
				next = nil
			}
			typed, typedExp = next, now+ttl
			if str != nil && now >= strExp {
				str = nil // the memory store hands an expired key's twin nil
			}
			snext, sr, sttl, err := f(str, now, p.Algorithm().Args(p, cost, "", 0))
			if err != nil {
				rt.Fatal(err)
			}
			if sttl <= 0 {
				snext = nil
			}
			str, strExp = snext, now+sttl
			want, err := driver.ParseReply(sr)
			if err != nil || r != want || ttl != sttl {
				rt.Fatalf("step %d: Step %+v ttl %d, local %+v ttl %d (%v)", i, r, ttl, want, sttl, err)
			}
			if r.Allowed && ttl != r.ResetAfter {
				rt.Fatalf("step %d: admitted, key lives %d µs, resets in %d", i, ttl, r.ResetAfter)
			}
		}
	})
}

// FuzzLocal: the Go twin parses any ARGV without panicking, and whatever
// it accepts within a policy's bounds it answers with a well-formed reply,
// on a fresh key and on the state its first decision left.
func FuzzLocal(f *testing.F) {
	f.Add("3", "1000000", "1", "")
	f.Add("1000000000", "1000000", "1000000000", "1767225600000000")
	f.Add("2", "1", "2", "-5")
	f.Add("x", "1", "1", "1.5")
	local := slidingcounter.Algorithm.Script().Local()
	f.Fuzz(func(t *testing.T, l, w, n, now string) {
		args := []string{l, w, n}
		if now != "" {
			args = append(args, now)
		}
		var st any
		for range 2 {
			next, r, _, err := local(st, storetest.T0, args)
			if err != nil {
				return
			}
			lim, _ := strconv.ParseInt(l, 10, 64)
			win, _ := strconv.ParseInt(w, 10, 64)
			if lim > core.MaxLimit || win > core.MaxInterval.Microseconds() || lim > slidingcounter.MaxProduct/win {
				return // beyond what a Policy allows
			}
			if _, err := driver.ParseReply(r); err != nil {
				t.Fatalf("args %q on %v: reply %v: %v", args, st, r, err)
			}
			st = next
		}
	})
}

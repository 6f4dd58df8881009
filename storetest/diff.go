package storetest

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core/driver"
)

// RunDifferential applies random sequences of (cost, pause) to the store on
// its own clock and to the algorithm's Go twin fed the store's time from each
// reply: every decision and every remaining count must be identical.
func RunDifferential(t *testing.T, h Harness) {
	s := h.MakeStore(t)
	t.Run("token_bucket", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			capacity := rapid.Int64Range(1, 8).Draw(rt, "capacity")
			rate := rapid.SampledFrom([]float64{50, 200, 333, 1000}).Draw(rt, "rate")
			p, err := tokenbucket.Policy("difftb", capacity, rate)
			if err != nil {
				rt.Fatal(err)
			}
			key := driver.StorageKey("storetest:", p.Name(), fmt.Sprintf("rapid-%d", seq.Add(1)))
			var st tokenbucket.State
			var ok bool
			t0 := int64(0)
			for i := range rapid.IntRange(1, 25).Draw(rt, "steps") {
				cost := rapid.Int64Range(1, capacity).Draw(rt, fmt.Sprint("cost", i))
				pause := rapid.IntRange(0, 3000).Draw(rt, fmt.Sprint("pause_us", i))
				time.Sleep(time.Duration(pause) * time.Microsecond)
				got := Decide(rt, s, p, key, cost, 0)
				if t0 == 0 {
					t0 = got.Now
				}
				var want [driver.ReplyLen]int64
				var changed bool
				var next tokenbucket.State
				next, changed, want = tokenbucket.Decide(st, ok, got.Now, p.Limit(), p.Interval().Microseconds(), cost)
				if changed {
					st, ok = next, true
				}
				check(rt, i, got, want)
			}
		})
	})
	t.Run("sliding_window", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			limit := rapid.Int64Range(1, 8).Draw(rt, "limit")
			window := rapid.SampledFrom([]time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}).Draw(rt, "window")
			p, err := slidingwindow.Policy("diffsw", limit, window)
			if err != nil {
				rt.Fatal(err)
			}
			key := driver.StorageKey("storetest:", p.Name(), fmt.Sprintf("rapid-%d", seq.Add(1)))
			var log slidingwindow.Log
			for i := range rapid.IntRange(1, 25).Draw(rt, "steps") {
				cost := rapid.Int64Range(1, limit).Draw(rt, fmt.Sprint("cost", i))
				pause := rapid.IntRange(0, 3000).Draw(rt, fmt.Sprint("pause_us", i))
				time.Sleep(time.Duration(pause) * time.Microsecond)
				got := Decide(rt, s, p, key, cost, 0)
				want := slidingwindow.Decide(&log, got.Now, limit, window.Microseconds(), cost)
				check(rt, i, got, want)
			}
		})
	})
	t.Run("sliding_window_counter", func(t *testing.T) { diffSlidingCounter(t, s) })
}

func check(rt *rapid.T, i int, got driver.Reply, want [driver.ReplyLen]int64) {
	w, err := driver.ParseReply(want[:])
	if err != nil {
		rt.Fatalf("step %d: twin reply %v: %v", i, want, err)
	}
	if got != w {
		rt.Fatalf("step %d: store %+v, twin %+v", i, got, w)
	}
}

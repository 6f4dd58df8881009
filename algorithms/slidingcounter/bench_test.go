package slidingcounter_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

// BenchmarkDecide is the Go twin's decision: Decide on a value state, Step
// on the *State the memory store keeps (updated in place), and the string
// twin the memory store's Run calls, each on one key, mixing admissions and
// denials (a limit of 1000 a 10 ms window, a request every 5 µs).
func BenchmarkDecide(b *testing.B) {
	const lim, w = 1000, 10_000
	p := must(slidingcounter.Policy("bench", lim, w*time.Microsecond))
	b.Run("Decide", func(b *testing.B) {
		var st slidingcounter.State
		var ok bool
		now := storetest.T0
		var admitted int
		for b.Loop() {
			now += 5
			next, changed, _ := slidingcounter.Decide(st, ok, now, lim, w, 1)
			if changed {
				st, ok = next, true
				admitted++
			}
		}
		b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
	})
	b.Run("Step", func(b *testing.B) {
		alg := slidingcounter.Algorithm.(driver.DirectAlgorithm)
		var st any
		now := storetest.T0
		b.ReportAllocs()
		for b.Loop() {
			now += 5
			st, _, _ = alg.Step(p, st, st != nil, now, 1)
		}
	})
	b.Run("local", func(b *testing.B) {
		f := slidingcounter.Algorithm.Script().Local()
		args := p.Algorithm().Args(p, 1, "", 0)
		var st any
		now := storetest.T0
		b.ReportAllocs()
		for b.Loop() {
			now += 5
			st, _, _, _ = f(st, now, args)
		}
	})
}

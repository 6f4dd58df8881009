package slidingcounter_test

import (
	"math"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

// TestQuota: the capabilities the config loader, the middleware and the
// demo ask of the counter, with exact values; the package registers it.
func TestQuota(t *testing.T) {
	alg, err := driver.AlgorithmByName(slidingcounter.Name)
	if err != nil || alg != slidingcounter.Algorithm {
		t.Fatalf("AlgorithmByName(%q) = %v, %v", slidingcounter.Name, alg, err)
	}
	p, err := alg.(driver.WindowAlgorithm).WindowPolicy("api", 20, 2*time.Second)
	if err != nil || p.Limit() != 20 || p.Interval() != 2*time.Second || p.Algorithm() != alg {
		t.Fatalf("WindowPolicy = %v, %v", p, err)
	}
	q := alg.(driver.Quotaer)
	if units, w := q.Quota(p); units != 20 || w != 2*time.Second {
		t.Errorf("Quota = %d per %v", units, w)
	}
	if got := q.Describe(p); got != "sliding window counter 20 per 2s" {
		t.Errorf("Describe = %q", got)
	}
	for _, tc := range []struct {
		d           time.Duration
		ideal, most float64
	}{
		{0, 20, 20},
		{time.Second, 20, 40},
		{2 * time.Second, 20, 40},
		{5 * time.Second, 48, 80}, // 20 + ⌊19 × 1.5⌋
		{6 * time.Second, 58, 80},
	} {
		if ideal, most := q.Bound(p, tc.d); ideal != tc.ideal || most != tc.most {
			t.Errorf("Bound(%v) = %v, %v; want %v, %v", tc.d, ideal, most, tc.ideal, tc.most)
		}
	}
}

// TestBoundIsTheLeast: the ideal Bound gives is what one counter admits at
// the least, to within a unit, to a client asking all the time from a
// span's start, wherever in a fixed window the span starts; the most it
// admits is within the bound over any span. A client of 20 a second over
// 7.5 s gets 144 to 162, so the ideal is 143, not 20 × 7.5 = 150.
func TestBoundIsTheLeast(t *testing.T) {
	const w = 1_000_000
	for _, lim := range []int64{1, 2, 3, 20, 100} {
		p := must(slidingcounter.Policy("sc", lim, time.Second))
		for _, windows := range []float64{0.3, 1, 1.5, 2.5, 7.5, 11.5} {
			d := int64(windows * w)
			least, most := int64(math.MaxInt64), int64(0)
			for phase := int64(0); phase < w; phase += w / 200 {
				var st slidingcounter.State
				var ok bool
				var n int64
				start := storetest.T0 + phase
				for now := start; now < start+d; now += w / (20 * lim) {
					if next, admit, _ := slidingcounter.Decide(st, ok, now, lim, w, 1); admit {
						st, ok, n = next, true, n+1
					}
				}
				least, most = min(least, n), max(most, n)
			}
			ideal, bound := slidingcounter.Algorithm.(driver.Quotaer).Bound(p, time.Duration(d)*time.Microsecond)
			if float64(least) < ideal || float64(least) > ideal+1 || float64(most) > bound {
				t.Errorf("limit %d over %.1f windows: one counter admits %d to %d; Bound says %v from the start, %v over any span", lim, windows, least, most, ideal, bound)
			}
			if lim == 20 && windows == 7.5 && (least != 144 || most != 162 || ideal != 143) {
				t.Errorf("limit 20 over 7.5 windows: %d to %d, ideal %v; the comment says 144 to 162, 143", least, most, ideal)
			}
		}
	}
}

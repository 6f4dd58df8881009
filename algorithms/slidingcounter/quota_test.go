package slidingcounter_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core"
)

// TestQuota: the capabilities the config loader, the middleware and the
// demo ask of the counter, with exact values; the package registers it.
func TestQuota(t *testing.T) {
	alg, err := core.AlgorithmByName(slidingcounter.Name)
	if err != nil || alg != slidingcounter.Algorithm {
		t.Fatalf("AlgorithmByName(%q) = %v, %v", slidingcounter.Name, alg, err)
	}
	p, err := alg.(core.WindowAlgorithm).WindowPolicy("api", 20, 2*time.Second)
	if err != nil || p.Limit() != 20 || p.Interval() != 2*time.Second || p.Algorithm() != alg {
		t.Fatalf("WindowPolicy = %v, %v", p, err)
	}
	q := alg.(core.Quotaer)
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
		{5 * time.Second, 50, 80},
		{6 * time.Second, 60, 80},
	} {
		if ideal, most := q.Bound(p, tc.d); ideal != tc.ideal || most != tc.most {
			t.Errorf("Bound(%v) = %v, %v; want %v, %v", tc.d, ideal, most, tc.ideal, tc.most)
		}
	}
}

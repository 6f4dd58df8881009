package stats

import (
	"testing"
	"time"
)

func TestIndexUpperAgree(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 1000, 1 << 20, 1<<40 + 12345, 1<<63 - 1, 1<<64 - 1} {
		i := index(v)
		if i < prev || i >= buckets {
			t.Fatalf("index(%d) = %d after %d (buckets %d)", v, i, prev, buckets)
		}
		prev = i
		if u := upper(i); u < v || (i > 0 && upper(i-1) >= v) {
			t.Fatalf("value %d in bucket %d with upper %d, previous upper %d", v, i, u, upper(i-1))
		}
		if v >= sub && float64(upper(i)-v) > float64(v)/sub {
			t.Fatalf("value %d: bucket upper %d is more than 1/%d away", v, upper(i), sub)
		}
	}
}

func TestQuantile(t *testing.T) {
	var h Hist
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, time.Millisecond}} {
		got := h.Quantile(c.q)
		if got < c.want || float64(got-c.want) > float64(c.want)/sub {
			t.Errorf("Quantile(%v) = %v, want %v within 1/%d", c.q, got, c.want, sub)
		}
	}
	if h.Max() != time.Millisecond || h.Count() != 1000 {
		t.Errorf("max %v count %d", h.Max(), h.Count())
	}
	var m Hist
	m.Merge(&h)
	m.Merge(&h)
	if m.Count() != 2000 || m.Quantile(0.5) != h.Quantile(0.5) {
		t.Errorf("merge: count %d p50 %v", m.Count(), m.Quantile(0.5))
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{3, 1, 2, 4})
	if s != (Summary{Min: 1, Median: 2, Max: 4, N: 4}) {
		t.Errorf("%+v", s)
	}
	if (Summarize(nil) != Summary{}) {
		t.Error("empty")
	}
}

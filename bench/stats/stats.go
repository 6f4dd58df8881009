// Package stats holds the benchmark harness's arithmetic: a latency
// histogram cheap enough to record every decision, and the min/median/max
// of repeated runs.
package stats

import (
	"math/bits"
	"slices"
	"time"
)

// subBits sets the histogram's resolution: 2^subBits buckets per power of
// two, so a recorded value is off by at most 1/32 (about 3%).
const subBits = 5

const sub = 1 << subBits

// buckets covers every uint64 nanosecond count.
const buckets = (64 - subBits + 1) * sub

// Hist is a log-linear latency histogram in nanoseconds. The zero value is
// empty and ready; it is not safe for concurrent use (give each worker its
// own and Merge them).
type Hist struct {
	counts [buckets]uint64
	n      uint64
	max    time.Duration
}

func index(v uint64) int {
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1
	return (e+1)*sub + int(v>>e) - sub
}

// upper is the largest value that falls in bucket i.
func upper(i int) uint64 {
	if i < sub {
		return uint64(i)
	}
	e := i/sub - 1
	m := uint64(i%sub + sub)
	return (m+1)<<e - 1
}

// Record adds one latency.
func (h *Hist) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[index(uint64(d))]++
	h.n++
	h.max = max(h.max, d)
}

// Merge adds o's counts to h.
func (h *Hist) Merge(o *Hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Count is the number of recorded latencies.
func (h *Hist) Count() uint64 { return h.n }

// Max is the largest recorded latency, exactly.
func (h *Hist) Max() time.Duration { return h.max }

// Quantile returns the latency at or below which a fraction q of the
// recorded latencies fall (the upper edge of its bucket, capped at Max).
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(upper(i)), h.max)
		}
	}
	return h.max
}

// Summary is the spread of one figure over repeated runs.
type Summary struct {
	Min, Median, Max float64
	N                int
}

// Summarize returns the min, median and max of xs (the lower median of an
// even count, so it is always one of the runs).
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Summary{Min: s[0], Median: s[(len(s)-1)/2], Max: s[len(s)-1], N: len(s)}
}

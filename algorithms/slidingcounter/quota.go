package slidingcounter

import (
	"math"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var (
	_ driver.Quotaer         = algorithm{}
	_ driver.WindowAlgorithm = algorithm{}
)

func init() { driver.Register(Algorithm) }

// WindowPolicy is Policy, for the config loader: a limit and a window.
func (algorithm) WindowPolicy(name string, limit int64, window time.Duration) (core.Policy, error) {
	return Policy(name, limit, window)
}

// Quota is the limit over the window.
func (algorithm) Quota(p core.Policy) (int64, time.Duration) { return p.Limit(), p.Interval() }

// Bound is, from the start of a span, what one counter admits at the least
// to a client asking all the time: the limit at once, then limit − 1 a
// window, limit + ⌊(limit − 1) × (d ÷ window − 1)⌋ — while the previous
// window weighs anything the estimate stays above the window's count, so
// the window's last unit never fits (a limit of 1: one unit every other
// window, ⌈d ÷ 2 windows⌉). A span that starts late in a fixed window gets
// up to limit − 1 more (its first window, short, still admits the limit):
// over 7.5 windows of 20 a counter admits 144 to 162 as the span's start
// moves through a window, where the ideal is 143 (TestBoundIsTheLeast).
// Over any span it is limit × (⌈d ÷ window⌉ + 1): at most the limit in
// each fixed window the span overlaps.
func (algorithm) Bound(p core.Policy, d time.Duration) (ideal, most float64) {
	w, lim := p.Interval(), p.Limit()
	windows := float64(d) / float64(w)
	if lim == 1 {
		ideal = max(math.Ceil(windows/2), 1)
	} else {
		ideal = float64(lim) + math.Floor(float64(lim-1)*max(windows-1, 0))
	}
	return ideal, float64(lim * (int64((d+w-1)/w) + 1))
}

// Describe returns e.g. "sliding window counter 20 per 2s".
func (algorithm) Describe(p core.Policy) string {
	return "sliding window counter " + strconv.FormatInt(p.Limit(), 10) + " per " + p.Interval().String()
}

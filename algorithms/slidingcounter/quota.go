package slidingcounter

import (
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
)

var (
	_ core.Quotaer         = algorithm{}
	_ core.WindowAlgorithm = algorithm{}
)

func init() { core.Register(Algorithm) }

// WindowPolicy is Policy, for the config loader: a limit and a window.
func (algorithm) WindowPolicy(name string, limit int64, window time.Duration) (core.Policy, error) {
	return Policy(name, limit, window)
}

// Quota is the limit over the window.
func (algorithm) Quota(p core.Policy) (int64, time.Duration) { return p.Limit(), p.Interval() }

// Bound is limit × max(d ÷ window, 1) from the start of a span — a fresh
// counter admits the limit at once, then about the limit a window as the
// first one's weight slides away — and limit × (⌈d ÷ window⌉ + 1) over any
// span: at most the limit in each fixed window the span overlaps.
func (algorithm) Bound(p core.Policy, d time.Duration) (ideal, most float64) {
	w, lim := p.Interval(), float64(p.Limit())
	return lim * max(float64(d)/float64(w), 1), lim * float64(int64((d+w-1)/w)+1)
}

// Describe returns e.g. "sliding window counter 20 per 2s".
func (algorithm) Describe(p core.Policy) string {
	return "sliding window counter " + strconv.FormatInt(p.Limit(), 10) + " per " + p.Interval().String()
}

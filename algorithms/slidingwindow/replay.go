package slidingwindow

import (
	_ "embed"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

//go:embed replay.lua
var replaySource string

// ReplayScript is the sliding window's replay: each grant's units are added
// with their original time and request id, so they count where they
// happened and a replay adds nothing twice (replay.lua).
var ReplayScript = driver.NewScript("reconcile_sliding_window", replaySource, nil)

// ReplayMultiScript applies several batches in one call, each as
// ReplayScript would alone (driver.NewMultiReplayScript of replay.lua).
var ReplayMultiScript = driver.NewMultiReplayScript("reconcile_sliding_window_multi", replaySource)

// MultiReplayScript is ReplayMultiScript.
func (algorithm) MultiReplayScript() *driver.Script { return ReplayMultiScript }

var (
	_ driver.MultiReplayer = algorithm{}
	_ driver.Quotaer       = algorithm{}
)

// ReplayCall returns the replay.lua call for batch b: KEYS the window and
// the marker; ARGV the window, the marker TTL, the seed and the grants as
// (time, cost, id) triples.
func (algorithm) ReplayCall(b *driver.Batch, o driver.ReplayOptions) driver.Call {
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	args := make([]string, 0, 5+3*len(b.Grants))
	// The seed's member prefix only when there are seed units: every
	// distinct argument is a new string for the script's Lua heap.
	prefix := ""
	if b.Seed.Value > 0 && b.Seed.At > 0 {
		prefix = "seed:" + b.ID + ":"
	}
	args = append(args, i64(b.Policy.Interval().Microseconds()), i64(o.MarkerTTL.Milliseconds()), i64(b.Seed.Value), i64(b.Seed.At), prefix)
	for _, g := range b.Grants {
		args = append(args, i64(g.At), i64(g.Cost), g.ID)
	}
	return driver.Call{Script: ReplayScript, Keys: []string{b.Key, o.MarkerKey}, Args: args}
}

// Coalesces is false: each grant keeps its own time and request id.
func (algorithm) Coalesces() bool { return false }

// Outdated reports a grant that has left the window.
func (algorithm) Outdated(p core.Policy, at, now int64) bool {
	return at <= now-p.Interval().Microseconds()
}

// Quota is the limit over the window.
func (algorithm) Quota(p core.Policy) (int64, time.Duration) { return p.Limit(), p.Interval() }

// Bound is limit × ⌈d ÷ window⌉ from the start of a span, and limit ×
// (whole windows in d + 1) over any span, which may straddle window starts.
func (algorithm) Bound(p core.Policy, d time.Duration) (ideal, most float64) {
	w := p.Interval()
	return float64(p.Limit() * int64((d+w-1)/w)), float64(p.Limit() * (int64(d/w) + 1))
}

// Describe returns e.g. "sliding window 20 per 2s".
func (algorithm) Describe(p core.Policy) string {
	return "sliding window " + strconv.FormatInt(p.Limit(), 10) + " per " + p.Interval().String()
}

func init() { driver.Register(Algorithm) }

var _ driver.WindowAlgorithm = algorithm{}

// WindowPolicy is Policy, for the config loader.
func (algorithm) WindowPolicy(name string, limit int64, window time.Duration) (core.Policy, error) {
	return Policy(name, limit, window)
}

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

// ReplayScript is the sliding window's replay (driver.NewReplayScript of
// replay.lua): each grant's units are added with their original time and
// request id, so they count where they happened and a replay adds nothing
// twice.
var ReplayScript = driver.NewReplayScript("reconcile_sliding_window", replaySource)

// ReplayScript returns ReplayScript.
func (algorithm) ReplayScript() *driver.Script { return ReplayScript }

var (
	_ driver.Replayer = algorithm{}
	_ driver.Quotaer  = algorithm{}
)

// ReplayArgs appends replay.lua's arguments for batch b: the seed and the
// grants as (time, cost, id) triples.
func (algorithm) ReplayArgs(args []string, b *driver.Batch, _ driver.ReplayOptions) []string {
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	// The seed's member prefix only when there are seed units: every
	// distinct argument is a new string for the script's Lua heap.
	prefix := ""
	if b.Seed.Value > 0 && b.Seed.At > 0 {
		prefix = "seed:" + b.ID + ":"
	}
	args = append(args, i64(b.Seed.Value), i64(b.Seed.At), prefix)
	for _, g := range b.Grants {
		args = append(args, i64(g.At), i64(g.Cost), g.ID)
	}
	return args
}

// ReplaySharedArgs appends replay.lua's shared argument for policy p: the
// window.
func (algorithm) ReplaySharedArgs(args []string, p driver.Policy, _ driver.ReplayOptions) []string {
	return append(args, strconv.FormatInt(p.Interval().Microseconds(), 10))
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

var _ driver.PlainReplayer = algorithm{}

// freshUnits is the most units FreshWrites writes in one ZADD: a batch of
// more goes to replay.lua, which adds them 500 at a time.
const freshUnits = 500

// FreshWrites is what replay.lua writes into a missing key: a ZADD of the
// seed's units and the grants' units still in the window at now, and a
// PEXPIRE for the key to live until the newest leaves it. An earlier now
// than the script's keeps a unit that has just left the window (the next
// decision trims it, uncounted) and gives the key a longer TTL.
func (algorithm) FreshWrites(w []string, b *driver.Batch, _ driver.ReplayOptions, now int64) ([]string, bool) {
	w, ttl, ok := appendUnits(w, b, now, true)
	if !ok || ttl == "" {
		return w, ok
	}
	return driver.AppendFresh(w, "PEXPIRE", ttl), true
}

// PlainWrites is what replay.lua does to the key of a batch without seed
// units in the window, whether the key exists or not: it adds the
// grants' units still in the window at now, members that a second ZADD
// adds nothing for, and extends the TTL to cover the newest. The commands
// are not atomic together, so the order keeps every unit: PEXPIRE GT
// first, so that a key about to expire outlives the ZADD; then the ZADD;
// then PEXPIRE NX, for a key the ZADD created. A batch with seed units
// goes to the scripts: they are written only into a missing key.
func (algorithm) PlainWrites(w []string, b *driver.Batch, _ driver.ReplayOptions, now int64) ([]string, bool) {
	if b.Seed.Value > 0 && b.Seed.At > now-b.Policy.Interval().Microseconds() {
		return w, false
	}
	start := len(w)
	w = driver.AppendFresh(w, "PEXPIRE", "", "GT")
	w, ttl, ok := appendUnits(w, b, now, false)
	if !ok || ttl == "" {
		return w[:start], ok
	}
	w[start+2] = ttl
	return driver.AppendFresh(w, "PEXPIRE", ttl, "NX"), true
}

// appendUnits appends to w the ZADD of batch b's units in the window at
// now (the seed's too, when seed), and returns the TTL in ms that keeps
// the key until the newest leaves the window, "" when there is none. ok
// is false, w unchanged, for more than freshUnits units.
func appendUnits(w []string, b *driver.Batch, now int64, seed bool) (_ []string, ttl string, ok bool) {
	width := b.Policy.Interval().Microseconds()
	oldest := now - width
	// One ZADD of every unit in the window; its word count is set once
	// the units are known.
	start := len(w)
	w = append(w, "", "ZADD")
	var units, newest int64
	if seed && b.Seed.Value > 0 && b.Seed.At > oldest {
		if units = b.Seed.Value; units > freshUnits {
			return w[:start], "", false
		}
		score := strconv.FormatInt(b.Seed.At, 10)
		prefix := "seed:" + b.ID + ":"
		for u := int64(1); u <= b.Seed.Value; u++ {
			w = append(w, score, prefix+strconv.FormatInt(u, 10))
		}
		newest = b.Seed.At
	}
	for _, g := range b.Grants {
		if g.At <= oldest || g.Cost <= 0 {
			continue
		}
		if units += g.Cost; units > freshUnits {
			return w[:start], "", false
		}
		score := strconv.FormatInt(g.At, 10)
		w = append(w, score, g.ID)
		for u := int64(1); u < g.Cost; u++ {
			w = append(w, score, g.ID+"#"+strconv.FormatInt(u, 10))
		}
		newest = max(newest, g.At)
	}
	if units == 0 {
		return w[:start], "", true
	}
	w[start] = strconv.FormatInt(1+2*units, 10)
	// newest is inside the window: the TTL is positive.
	return w, strconv.FormatInt((newest+width-now)/1000+1, 10), true
}

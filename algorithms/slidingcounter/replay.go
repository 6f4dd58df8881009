package slidingcounter

import (
	_ "embed"
	"strconv"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

//go:embed replay.lua
var replaySource string

// ReplayScript is the counter's replay of an outage's grants
// (driver.NewReplayScript of replay.lua): each grant counts in the fixed
// window of its original time, once per batch marker.
var ReplayScript = driver.NewReplayScript("reconcile_"+Name, replaySource)

// ReplayScript returns ReplayScript.
func (algorithm) ReplayScript() *driver.Script { return ReplayScript }

var _ driver.Replayer = algorithm{}

// ReplayArgs appends replay.lua's arguments for batch b: the seed (its
// estimate, counted whole in the window of its time: at least the units
// the key held then, in that window or the one before) and the grants as
// (time, cost) pairs. Its reply is {1, units counted}.
func (algorithm) ReplayArgs(args []string, b *driver.Batch, _ driver.ReplayOptions) []string {
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	est, _, _ := unpackSeed(b.Seed.Value)
	args = append(args, i64(est), i64(b.Seed.At))
	for _, g := range b.Grants {
		args = append(args, i64(g.At), i64(g.Cost))
	}
	return args
}

// ReplaySharedArgs appends replay.lua's shared arguments for policy p:
// the limit and the window.
func (algorithm) ReplaySharedArgs(args []string, p driver.Policy, _ driver.ReplayOptions) []string {
	return append(args, strconv.FormatInt(p.Limit(), 10), strconv.FormatInt(p.Interval().Microseconds(), 10))
}

var _ driver.FreshReplayer = algorithm{}

// FreshWrites is what replay.lua writes into a missing key: one SET of the
// counter its grants (and seed) leave, computed by Replay. The reconciler's
// now is a lower bound of the Redis time the SET runs at, so the window
// the counts are kept in is that of now or of the latest grant, whichever
// is later: a counter of a window the script's now has passed reads, at
// that now, as the script's (its current count rolls into the previous
// one, its previous count falls away, as the script skips grants two
// windows old). A grant ahead of Redis's clock keeps its own window, which
// a decision reads at that window's start: never more admitted than the
// script allows. The TTL is from now to the end of the window after the
// counts', so the key outlives both counts.
func (algorithm) FreshWrites(w []string, b *driver.Batch, _ driver.ReplayOptions, now int64) ([]string, bool) {
	at := now
	for _, g := range b.Grants {
		at = max(at, g.At)
	}
	width := b.Policy.Interval().Microseconds()
	s, added := Replay(State{}, false, b.Seed, b.Policy.Limit(), width, at, b.Grants)
	if added == 0 {
		// Nothing in the window: the script writes nothing either.
		return w, true
	}
	value := strconv.AppendInt(nil, s.Window, 10)
	value = append(value, ':')
	value = strconv.AppendInt(value, s.Cur, 10)
	value = append(value, ':')
	value = strconv.AppendInt(value, s.Prev, 10)
	life := (s.Window+2)*width - now
	return driver.AppendFresh(w, "SET", string(value), "PX", strconv.FormatInt(life/1000+1, 10)), true
}

// Coalesces is true: a grant charged at a later time counts in the same
// fixed window or a later one, which weighs it as much or more (up to the
// counts' bound of twice the limit).
func (algorithm) Coalesces() bool { return true }

// Outdated reports a grant older than the window before now's: the replay
// skips it.
func (algorithm) Outdated(p core.Policy, at, now int64) bool {
	w := p.Interval().Microseconds()
	return at/w < now/w-1
}

// count adds units to the window g of state s: its current count when g is
// s's window (or later), its previous count when g is the window before;
// false, with s unchanged, when g is older.
func (s State) count(g, units int64) (State, bool) {
	switch {
	case g >= s.Window:
		s.Cur += units
	case g == s.Window-1:
		s.Prev += units
	default:
		return s, false
	}
	return s, true
}

// Replay is the Go model of replay.lua, for tests and reasoning: it counts
// grants into the counter cur (ok false when the key is missing; the
// seed's estimate is counted then, like a grant) of limit lim and window w at store time now,
// and returns the state the key holds afterwards and the units counted.
// Grants of now's window (or later) count in the current window, grants of
// the one before in the previous window, older ones not at all; counts stop
// at 2 × lim. When nothing is counted the key is left as it was: next is
// cur.
func Replay(cur State, ok bool, seed driver.Seed, lim, w, now int64, grants []driver.Grant) (next State, added int64) {
	s := State{Window: now / w}
	if ok {
		s = cur.Roll(s.Window)
	}
	add := func(at, units int64) {
		var counted bool
		if s, counted = s.count(at/w, units); counted {
			added += units
		}
	}
	if est, _, _ := unpackSeed(seed.Value); !ok && seed.At > 0 && est > 0 {
		add(seed.At, est)
	}
	for _, g := range grants {
		add(g.At, g.Cost)
	}
	if added == 0 {
		return cur, 0
	}
	s.Cur, s.Prev = min(s.Cur, 2*lim), min(s.Prev, 2*lim)
	return s, added
}

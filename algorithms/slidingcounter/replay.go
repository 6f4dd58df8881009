package slidingcounter

import (
	_ "embed"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
)

//go:embed replay.lua
var replaySource string

// ReplayScript is the replay of an outage's grants (replay.lua), for
// implementers of reconciliation: one batch of one key, applied once under
// its batch marker. Build its calls with ReplayCall.
var ReplayScript = core.NewScript("reconcile_"+Name, replaySource, nil)

// ReplayCall builds the call that replays batch b with ReplayScript, for
// implementers of reconciliation: KEYS are b.Key and the batch's marker key
// marker (which must share b.Key's hash tag), ARGV the policy's limit and
// window, the marker's TTL, b.Seed and each grant's time and cost. The
// script's reply is {1, units counted} when it applied the batch, {0, 0}
// when the marker says it was applied before.
func ReplayCall(b *core.Batch, marker string, markerTTL time.Duration) (core.Call, error) {
	p := b.Policy
	if p.Algorithm() != Algorithm {
		return core.Call{}, core.Errorf(core.ErrInvalidPolicy, "batch %s: policy %s is not a %s policy", b.ID, p, Name)
	}
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	args := make([]string, 0, 5+2*len(b.Grants))
	args = append(args, i64(p.Limit()), i64(p.Interval().Microseconds()), i64(markerTTL.Milliseconds()),
		i64(b.Seed.Value), i64(b.Seed.At))
	for _, g := range b.Grants {
		args = append(args, i64(g.At), i64(g.Cost))
	}
	return core.Call{Script: ReplayScript, Keys: []string{b.Key, marker}, Args: args}, nil
}

// Replay is the Go model of replay.lua, for tests and reasoning: it counts
// grants into the counter cur (ok false when the key is missing; seed is
// counted then, like a grant) of limit lim and window w at store time now,
// and returns the state the key holds afterwards and the units counted.
// Grants of now's window (or later) count in the current window, grants of
// the one before in the previous window, older ones not at all; counts stop
// at 2 × lim. When nothing is counted the key is left as it was: next is
// cur.
func Replay(cur State, ok bool, seed core.Seed, lim, w, now int64, grants []core.Grant) (next State, added int64) {
	s := State{Window: now / w}
	if ok {
		s = cur.Roll(s.Window)
	}
	count := func(at, n int64) {
		switch g := at / w; {
		case g >= s.Window:
			s.Cur += n
		case g == s.Window-1:
			s.Prev += n
		default:
			return
		}
		added += n
	}
	if !ok && seed.At > 0 && seed.Value > 0 {
		count(seed.At, seed.Value)
	}
	for _, g := range grants {
		count(g.At, g.Cost)
	}
	if added == 0 {
		return cur, 0
	}
	s.Cur, s.Prev = min(s.Cur, 2*lim), min(s.Prev, 2*lim)
	return s, added
}

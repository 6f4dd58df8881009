package tokenbucket

import (
	"cmp"
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

//go:embed replay.lua
var replaySource string

// ReplayScript is the token bucket's replay (driver.NewReplayScript of
// replay.lua): it charges an outage batch its marginal cost in one global
// bucket fed every grant replayed in the same recovery (Replay is its Go
// model).
var ReplayScript = driver.NewReplayScript("reconcile_token_bucket", replaySource)

// ReplayScript returns ReplayScript.
func (algorithm) ReplayScript() *driver.Script { return ReplayScript }

var (
	_ driver.Replayer = algorithm{}
	_ driver.Quotaer  = algorithm{}
)

// ReplayArgs appends replay.lua's arguments for batch b: the seed, and
// the grants both as what they make of a bucket fed them alone (see
// replay.lua) and as text for the merge log.
func (algorithm) ReplayArgs(args []string, b *driver.Batch, _ driver.ReplayOptions) []string {
	p := b.Policy
	t := p.Interval().Microseconds()
	full := p.Limit() * t
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	grants := b.Grants
	if !slices.IsSortedFunc(grants, byTime) {
		grants = slices.SortedStableFunc(slices.Values(grants), byTime)
	}
	// Fed grants in time order, a bucket whose E is e ends at max(e + S,
	// A): E_k = max(E_k-1, at_k - full) + cost_k × t, unrolled.
	var s, a, x int64
	text := make([]byte, 0, 24*len(grants))
	for k := len(grants) - 1; k >= 0; k-- {
		g := grants[k]
		s += g.Cost * t
		if v := g.At - full + s; k == len(grants)-1 || v > a {
			a = v
		}
	}
	for k, g := range grants {
		if k > 0 {
			text = append(text, '|')
		}
		text = strconv.AppendInt(text, g.At, 10)
		text = append(text, '|')
		text = strconv.AppendInt(text, g.Cost, 10)
		x = g.At
	}
	return append(args, i64(b.Seed.Value), i64(b.Seed.At), strconv.Itoa(len(grants)), i64(x), i64(s), i64(a), string(text))
}

// ReplaySharedArgs appends replay.lua's shared arguments for policy p:
// the refill time, a full bucket's credit and the merge window.
func (algorithm) ReplaySharedArgs(args []string, p driver.Policy, o driver.ReplayOptions) []string {
	t := p.Interval().Microseconds()
	return append(args, strconv.FormatInt(t, 10), strconv.FormatInt(p.Limit()*t, 10), strconv.FormatInt(o.MergeWindow.Microseconds(), 10))
}

func byTime(a, b driver.Grant) int { return cmp.Compare(a.At, b.At) }

// ParseStored reads the E of a bucket's stored value: the decimal E, or
// E followed by a recovery's merge log ("E|...", replay.lua).
func ParseStored(v string) (int64, error) {
	if i := strings.IndexByte(v, '|'); i >= 0 {
		v = v[:i]
	}
	e, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, driver.Errorf(core.ErrMalformedReply, "token bucket value %q", v)
	}
	return e, nil
}

// Coalesces is true: a grant charged later finds less refill, so merging a
// key's grants at the latest of their times never counts them less.
func (algorithm) Coalesces() bool { return true }

// Outdated is false: a token bucket grant always counts (as a debt at
// worst).
func (algorithm) Outdated(core.Policy, int64, int64) bool { return false }

// Quota is the capacity over the time to refill it.
func (algorithm) Quota(p core.Policy) (int64, time.Duration) {
	// Capacity × interval stays below MaxCredit µs (about 35 years), far
	// from overflowing a Duration.
	return p.Limit(), time.Duration(p.Limit()) * p.Interval()
}

// Bound is capacity + rate × d, from the start and over any span alike.
func (algorithm) Bound(p core.Policy, d time.Duration) (ideal, most float64) {
	b := float64(p.Limit()) + Rate(p)*d.Seconds()
	return b, b
}

// Describe returns e.g. "token bucket 20 + 5/s".
func (algorithm) Describe(p core.Policy) string {
	return fmt.Sprintf("token bucket %d + %s/s", p.Limit(), strconv.FormatFloat(Rate(p), 'f', -1, 64))
}

// MergeLog is the Go model of a recovery's merge log: the bucket as it stood
// when the first batch arrived (its State.Empty), and every grant replayed
// since.
type MergeLog struct {
	Started bool
	Base    int64
	Grants  []driver.Grant
}

// Replay is the Go model of replay.lua, for tests and reasoning: it charges
// batch grants to the bucket whose Empty is cur (ok false when the key is
// missing; seed used then) of capacity c and interval t, with the
// recovery's merge log m, at store time now, and returns the new bucket's
// Empty.
func Replay(cur int64, ok bool, seed driver.Seed, m *MergeLog, c, t, now int64, grants []driver.Grant) int64 {
	full := c * t
	switch {
	case ok:
	case seed.At > 0:
		cur = seed.At - seed.Value
	default:
		cur = -full // full at any time since the epoch
	}
	if !m.Started {
		m.Started, m.Base = true, cur
	}
	prev := slices.Clone(m.Grants)
	m.Grants = append(m.Grants, grants...)
	all := slices.Clone(m.Grants)
	slices.SortStableFunc(prev, byTime)
	slices.SortStableFunc(all, byTime)
	// run feeds grants in time order to the base bucket: at each grant it
	// holds min(full, At − e), and the grant spends its cost.
	run := func(gs []driver.Grant) int64 {
		e := m.Base
		for _, g := range gs {
			e = max(e, g.At-full) + g.Cost*t
		}
		return e
	}
	x := now
	if len(all) > 0 {
		x = all[len(all)-1].At
		withAll, without := run(all), run(prev)
		cur = max(cur, x-full) + withAll - max(without, x-full)
	}
	return min(cur, max(now, x)+full)
}

func init() { driver.Register(Algorithm) }

var _ driver.RateAlgorithm = algorithm{}

// RatePolicy is Policy, for the config loader.
func (algorithm) RatePolicy(name string, capacity int64, perSecond float64) (core.Policy, error) {
	return Policy(name, capacity, perSecond)
}

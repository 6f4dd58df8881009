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
var ReplayScript = driver.NewReplayScript("reconcile_token_bucket", replaySource, luaLife)

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
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := feed(b)
	if f.m == 0 {
		f.x = b.Since // a restore: see replay.lua
	}
	return append(args, i64(b.Seed.Value), i64(b.Seed.At), strconv.Itoa(f.m), i64(f.x), i64(f.s), i64(f.a), f.text)
}

// fed is what batch b's grants make of a bucket fed them alone, in time
// order, and their merge log text (replay.lua's ARGV[i+2] to ARGV[i+6]).
type fed struct {
	m       int   // grants
	x, s, a int64 // latest grant time, their credit, the least E they leave
	text    string
}

func feed(b *driver.Batch) fed {
	p := b.Policy
	t := p.Interval().Microseconds()
	full := p.Limit() * t
	grants := b.Grants
	if !slices.IsSortedFunc(grants, byTime) {
		grants = slices.SortedStableFunc(slices.Values(grants), byTime)
	}
	// Fed grants in time order, a bucket whose E is e ends at max(e + S,
	// A): E_k = max(E_k-1, at_k - full) + cost_k × t, unrolled.
	f := fed{m: len(grants)}
	text := make([]byte, 0, 24*len(grants))
	for k := len(grants) - 1; k >= 0; k-- {
		g := grants[k]
		f.s += g.Cost * t
		if v := g.At - full + f.s; k == len(grants)-1 || v > f.a {
			f.a = v
		}
	}
	for k, g := range grants {
		if k > 0 {
			text = append(text, '|')
		}
		text = strconv.AppendInt(text, g.At, 10)
		text = append(text, '|')
		text = strconv.AppendInt(text, g.Cost, 10)
		f.x = g.At
	}
	f.text = string(text)
	return f
}

// maxLog is replay.lua's MAXLOG: a merge log of more grants is dropped.
const maxLog = 2000

var _ driver.FreshReplayer = algorithm{}

// FreshWrites is what replay.lua writes into a missing key: one SET of
// the bucket fed the batch from its seed (or full), with a merge log that
// starts at now; for a batch of no grants (a restore), the seed's bucket
// alone, or nothing when it is full by now. An earlier now than the script's starts the merge and
// ends it earlier (a later batch then starts a log of its own, charged
// against the stored bucket: never less), gives the key a longer TTL,
// and caps a debt at a full bucket a little sooner.
func (algorithm) FreshWrites(w []string, b *driver.Batch, o driver.ReplayOptions, now int64) ([]string, bool) {
	f := feed(b)
	p := b.Policy
	full := p.Limit() * p.Interval().Microseconds()
	if f.m == 0 {
		// A restore: the seed's bucket, unless full again by now.
		e := b.Seed.At - b.Seed.Value
		if b.Seed.At <= 0 || e+full <= now {
			return w, true
		}
		return appendAlone(w, e, full, now), true
	}
	cur := -full
	if b.Seed.At > 0 {
		cur = b.Seed.At - b.Seed.Value
	}
	e := max(cur+f.s, f.a)
	e = min(e, max(now, f.x)+full)
	if f.m > maxLog {
		return appendAlone(w, e, full, now), true
	}
	var value []byte
	value = strconv.AppendInt(value, e, 10)
	value = append(value, '|')
	value = strconv.AppendInt(value, now, 10)
	value = append(value, '|')
	value = strconv.AppendInt(value, cur, 10)
	value = append(value, '|')
	value = append(value, f.text...)
	ttl := max(floorDiv(e+full-now, 1000)+1, floorDiv(o.MergeWindow.Microseconds(), 1000)+1)
	return driver.AppendFresh(w, "SET", string(value), "PX", strconv.FormatInt(max(ttl, 1), 10)), true
}

// appendAlone appends the write of E alone into a missing key, living to
// the end of E's quarter (lifeMs).
func appendAlone(w []string, e, full, now int64) []string {
	return driver.AppendFresh(w, "SET", strconv.FormatInt(e, 10), "PX", strconv.FormatInt(lifeMs(e, full, now), 10))
}

// lifeMs is how long, in ms from now, a key holding E alone lives (SET
// PX): until (⌊e ÷ q⌋ + 1)·q + full µs and 1–2 ms more, where q is a
// quarter of full and at least 1 ms. The key so lives until the bucket is
// full again, e + full, and at most about q longer; and the instant it
// lives until is the same for every E in one quarter, so a spend that
// leaves E in the quarter of the E the key holds keeps its expiry (SET
// KEEPTTL, tokenbucket.lua). Every writer of a key holding E alone sets
// it: the decision and its Many, the refund, the replay. Never below 1.
func lifeMs(e, full, now int64) int64 {
	start, q := quarter(e, full)
	return max(floorDiv(start+q+full-now, 1000)+2, 1)
}

// quarter returns the start of E's quarter, ⌊e ÷ q⌋·q, and q, a quarter
// of full and at least 1 ms: a spend that leaves E at or past the start of
// the quarter of the new E keeps the key's expiry (tokenbucket.lua).
func quarter(e, full int64) (start, q int64) {
	q = max(full/4, 1000)
	return floorDiv(e, q) * q, q
}

// floorDiv is ⌊a ÷ b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
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

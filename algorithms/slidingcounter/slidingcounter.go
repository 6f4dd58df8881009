// Package slidingcounter is the sliding window counter algorithm: the
// current and the previous fixed window of length Window, weighted by how
// much of the previous one the sliding window still overlaps, as Cloudflare
// counts at scale. At e microseconds into the current window the counter
// estimates the units admitted in the last Window as
//
//	prev × (Window − e) / Window + cur
//
// and admits a cost n when that estimate plus n is at most Limit. Windows
// are aligned to multiples of Window in the store's clock.
//
// The counter is an approximation of the sliding window log (package
// slidingwindow) in two integers a key, however large the limit: no fixed
// window ever admits more than Limit, but a window of length Window that
// straddles two fixed ones may (at most twice Limit, when the traffic of a
// whole window arrives at its very end). docs/slidingcounter.md measures it
// against the exact log on steady, bursty and over-limit traffic.
//
// Redis keeps one string a key, "k:cur:prev" in decimal (k the current
// window's index), living until the end of the next window (at most
// 2 × Window). MEMORY USAGE on Redis 7.0 (jemalloc), key hf:{sc:k000000}:
// 88 B while the string is at most 12 characters (a few units a minute),
// 104 B up to 28 (any limit up to 10^6 a window of a second or more), 120 B
// for the longest (38). The token bucket's one integer takes 72 B; the
// sliding window's sorted set grows with the units in its window: 184 B
// for 3, 3.6 KB for 100, 25 KB for 200 (TestRedisMemoryPerKey).
//
// All arithmetic is on integers below 2^53 (Limit × Window is at most
// MaxProduct and counts are read at most 2 × Limit), so the Lua script
// (slidingcounter.lua) and its Go twin (Decide) return identical answers.
//
// Algorithm has the capabilities of core's seam: driver.Leaser (one
// instance's 1/n share during an outage, counted on sub-units),
// driver.Replayer (an outage's grants counted once, each in the fixed window
// of its original time: ReplayScript, modelled by Replay), driver.Quotaer and
// driver.WindowAlgorithm (configured as limit and window). The package
// registers it with driver.Register.
package slidingcounter

import (
	_ "embed"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Name is the algorithm's config name.
const Name = "sliding_window_counter"

// MaxProduct bounds Limit × Window, in unit-microseconds, so every
// intermediate value of the script stays an exact integer in Lua's doubles:
// a limit of 10^9 a second, 18 million a minute, 312 thousand an hour.
const MaxProduct = 1 << 50

//go:embed counter.lua
var counter string

//go:embed slidingcounter.lua
var source string

//go:embed many.lua
var manySource string

// script is the decision; peekScript the same source with PEEK set, the
// reply without the write (driver.Peeker); its Many is several
// decisions on one key (driver.Many): the policy's L and W shared, a cost
// each.
var (
	script, peekScript = driver.NewDecisionScripts(Name, driver.LuaIDiv+counter+source, local, cloneState)
	_                  = script.WithMany(driver.NewMany(Name+"_many", driver.LuaManyHelpers+driver.LuaIDiv+counter+manySource, 2, 1))
)

// cloneState copies the state the memory store holds, for a peek.
func cloneState(prev any) any {
	if st, ok := prev.(*State); ok {
		c := *st
		return &c
	}
	return prev
}

type algorithm struct{}

// Algorithm is the sliding window counter as a driver.Algorithm. It is also a
// driver.DirectAlgorithm.
var Algorithm driver.Algorithm = algorithm{}

var _ driver.DirectAlgorithm = algorithm{}

// Policy returns a sliding window counter policy named name that admits at
// most limit units in each fixed window of length window, and about limit
// in any window of that length.
func Policy(name string, limit int64, window time.Duration) (core.Policy, error) {
	return driver.NewPolicy(name, Algorithm, limit, window)
}

func (algorithm) Name() string           { return Name }
func (algorithm) Script() *driver.Script { return script }
func (algorithm) NeedsID() bool          { return false }

func (algorithm) Validate(limit int64, window time.Duration) error {
	if w := window.Microseconds(); limit > MaxProduct/w {
		return driver.Errorf(core.ErrInvalidPolicy, "sliding window counter: limit %d × window %v is beyond %d unit-µs", limit, window, int64(MaxProduct))
	}
	return nil
}

func (algorithm) Args(p core.Policy, cost int64, _ string, nowMicros int64) []string {
	// Room for the optional now and the deadline a caller appends
	// (driver.DeadlineArg): one allocation per call.
	args := append(make([]string, 0, 6),
		strconv.FormatInt(p.Limit(), 10),
		strconv.FormatInt(p.Interval().Microseconds(), 10),
		strconv.FormatInt(cost, 10),
	)
	if nowMicros > 0 {
		args = append(args, strconv.FormatInt(nowMicros, 10))
	}
	return args
}

// State is a counter: Cur units admitted in the fixed window of index
// Window (the microseconds [Window × W, (Window+1) × W)) and Prev in the
// window before it. It is what Redis stores, as "Window:Cur:Prev".
type State struct {
	Window int64
	Cur    int64
	Prev   int64
}

// Size is the state's size in bytes, for memory accounting.
func (State) Size() int64 { return 24 }

// Roll is the state as of window j: a window later the current count has
// become the previous one, two windows later both are gone. A state of a
// window after j (a clock that stepped back) is kept as it is.
func (s State) Roll(j int64) State {
	switch {
	case s.Window >= j:
		return s
	case s.Window == j-1:
		return State{Window: j, Prev: s.Cur}
	}
	return State{Window: j}
}

// Estimate is the estimated count of the sliding window ending at now, for
// window w, rounded up: Cur + ceil(Prev × (w − e) / w), e microseconds into
// the state's window (rolled to now's). A state of a later window is read
// at that window's start.
func (s State) Estimate(now, w int64) int64 {
	s = s.Roll(now / w)
	return s.Cur + weighted(s, now, w)
}

// weighted is ceil(Prev × (w − e) / w) for the state s, already rolled to
// now's window or later.
func weighted(s State, now, w int64) int64 {
	start := s.Window * w
	e := max(now-start, 0)
	return (s.Prev*(w-e) + w - 1) / w
}

// Decide is the Go twin of slidingcounter.lua: given the counter st (ok
// false when the key holds nothing), the time now in microseconds, the
// limit lim, the window w in microseconds and the cost n, it returns the
// next state, whether it changed (an admission), and the script's reply.
func Decide(st State, ok bool, now, lim, w, n int64) (next State, changed bool, reply [driver.ReplyLen]int64) {
	next, admit, remaining, retry, reset := decide(st, ok, now, lim, w, n, 1, 0)
	if !admit {
		return st, false, [driver.ReplyLen]int64{0, remaining, retry, reset, now}
	}
	return next, true, [driver.ReplyLen]int64{1, remaining, 0, reset, now}
}

// decide is the one decision every twin makes (Decide, the lease, the
// memory store's steps), on counts in sub-units: a unit weighs unit and a
// request needs need sub-units (the script: unit 1, need n). The estimate
// may reach lim + slack, the current window's count lim: slack is a
// lease's carry (see lease), 0 for the script. It returns the state after
// an admission (the rolled state on a denial), whether it admits, the units
// remaining, the retry time and the reset time.
func decide(st State, ok bool, now, lim, w, need, unit, slack int64) (s State, admit bool, remaining, retry, reset int64) {
	s = State{Window: now / w}
	if ok {
		s = st.Roll(s.Window)
		s.Cur, s.Prev = min(s.Cur, 2*lim), min(s.Prev, 2*lim)
	}
	pw := weighted(s, now, w)
	room := min(lim+slack-s.Cur-pw, lim-s.Cur)
	if need <= room {
		s.Cur += need
		return s, true, (room - need) / unit, 0, (s.Window+2)*w - now
	}
	switch {
	case s.Cur > 0:
		reset = (s.Window+2)*w - now
	case s.Prev > 0:
		reset = (s.Window+1)*w - now
	}
	return s, false, max(room, 0) / unit, retryAfter(s, now, lim, w, need, slack, carry(s, lim, slack, unit)), reset
}

// carry is the room a lease of unit sub-units a unit carries out of the
// rolled state s (holding slack) into the next window: what its estimate
// still had at the window's end, lim + slack − Cur less the previous
// window's last sub-unit (the weight never reaches 0 inside the window),
// at most one unit less one sub-unit. 0 for the script (unit 1).
func carry(s State, lim, slack, unit int64) int64 {
	left := lim + slack - s.Cur
	if s.Prev > 0 {
		left--
	}
	return min(max(left, 0), unit-1)
}

// retryAfter is how long until need more sub-units fit in the rolled state
// s if nothing else is spent: later in this window, once the window's count
// has room and p × (w − e) ≤ (lim + slack − c − need) × w, or else in the
// next, once c × (w − e) ≤ (lim + next − need) × w (next: the slack it
// will hold).
func retryAfter(s State, now, lim, w, need, slack, next int64) int64 {
	start := s.Window * w
	if room := lim + slack - s.Cur - need; s.Prev > 0 && room >= 0 && s.Cur+need <= lim {
		if e := w - room*w/s.Prev; e < w {
			return start + e - now
		}
	}
	e := int64(0)
	if s.Cur > 0 {
		e = max(w-(lim+next-need)*w/s.Cur, 0)
	}
	return start + w + e - now
}

// local is the Go twin as a driver.LocalFunc, for the memory store: it
// parses the script's ARGV and decides as Step does.
func local(prev any, now int64, args []string) (any, []int64, int64, error) {
	v, err := driver.ParseArgs(args, 3, 4)
	if err != nil {
		return prev, nil, 0, err
	}
	lim, w, n := v[0], v[1], v[2]
	if lim < 1 || w < 1 || n < 1 || n > lim {
		return prev, nil, 0, driver.Errorf(core.ErrInvalidPolicy, "sliding window counter: bad arguments %q", args)
	}
	if len(v) == 4 && v[3] > 0 {
		now = v[3]
	}
	next, r, ttl := step(prev, prev != nil, now, lim, w, n)
	return next, []int64{b2i(r.Allowed), r.Remaining, r.RetryAfter, r.ResetAfter, r.Now}, ttl, nil
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Step is the Go twin on typed arguments (driver.DirectAlgorithm): the
// decision local makes for ARGV Args(p, cost, "", 0).
func (algorithm) Step(p core.Policy, prev any, live bool, now, cost int64) (any, driver.Reply, int64) {
	return step(prev, live, now, p.Limit(), p.Interval().Microseconds(), cost)
}

// step decides on the *State the memory store holds (prev, if live; an
// expired one is reused), updated in place. The key lives until the end of
// the window after its state's: then it reads as no state at all.
func step(prev any, live bool, now, lim, w, n int64) (any, driver.Reply, int64) {
	st, _ := prev.(*State)
	ok := live && st != nil
	var cur State
	if ok {
		cur = *st
	}
	next, admit, remaining, retry, reset := decide(cur, ok, now, lim, w, n, 1, 0)
	r := driver.Reply{Allowed: admit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset, Now: now}
	if !admit {
		// A denial needs a state: a fresh counter admits any valid cost.
		return prev, r, max((cur.Window+2)*w-now, 0)
	}
	if st == nil {
		st = new(State)
	}
	*st = next
	return st, r, reset
}

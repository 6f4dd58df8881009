// Package tokenbucket is the token bucket algorithm: a bucket of Capacity
// tokens refilled at a steady rate; a request of cost n is admitted when n
// tokens are in the bucket, and takes them.
//
// The bucket is kept as credit: the microseconds of refill time that have
// accrued and not been spent, capped at Capacity × T where T is the time to
// refill one token. Redis stores one integer per key, the instant the credit
// was (or will be) zero (State.Empty). Everything is integer arithmetic below
// 2^53, so the Lua script (tokenbucket.lua) and its Go twin (Decide) return
// identical answers.
package tokenbucket

import (
	_ "embed"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Name is the algorithm's config name.
const Name = "token_bucket"

// MaxCredit bounds Capacity × T, in microseconds, so every intermediate value
// of the script stays an exact integer in Lua's doubles.
const MaxCredit = 1 << 50

//go:embed tokenbucket.lua
var source string

//go:embed many.lua
var manySource string

// The reading and the write of the bucket, and the tokens left, which the
// decision and its Many both compute: inline puts them in line in each
// script's source, at its #read, #write and #remaining comments, so that
// neither pays a function call for them and both have one text of them.
var (
	//go:embed read.lua
	luaRead string
	//go:embed write.lua
	luaWrite string
	//go:embed remaining.lua
	luaRemaining string
)

func inline(src string) string {
	return strings.NewReplacer("-- #read\n", luaRead, "-- #write\n", luaWrite, "-- #remaining\n", luaRemaining).Replace(src)
}

// script is the decision; peekScript the same source with PEEK set, the
// reply without the write (driver.Peeker); its Many is several
// decisions on one key (driver.Many): the policy's C and T shared, a cost
// each.
var (
	script, peekScript = driver.NewDecisionScripts(Name, inline(source), local, cloneState)
	_                  = script.WithMany(driver.NewMany(Name+"_many", inline(manySource), 2, 1))
)

// luaLife is life_ms(e, full, now), lifeMs in Lua: the PX, a decimal
// string, of a key holding E alone, written at now. refund.lua and
// replay.lua call it; tokenbucket.lua and many.lua have it in line, with
// the quarter they also need. (idiv: driver.LuaIDiv, before
// it.) string.format: see tokenbucket.lua.
const luaLife = `-- life_ms: a key holding E alone lives to the end of E's quarter (lifeMs).
local function life_ms(e, full, now)
  local q = math.max(math.floor(full / 4), 1000)
  local ms = math.floor(((idiv(e, q) + 1) * q + full - now) / 1000) + 2
  if ms < 1 then
    ms = 1
  end
  return string.format('%d', ms)
end
`

// cloneState copies the state the memory store holds, for a peek.
func cloneState(prev any) any {
	if st, ok := prev.(*State); ok {
		c := *st
		return &c
	}
	return prev
}

type algorithm struct{}

// Algorithm is the token bucket as a driver.Algorithm. It is also a
// driver.DirectAlgorithm.
var Algorithm driver.Algorithm = algorithm{}

var _ driver.DirectAlgorithm = algorithm{}

// Policy returns a token bucket policy named name with the given capacity,
// refilled at perSecond tokens per second. The refill interval is rounded to
// a whole microsecond; Rate reports the rate actually enforced.
func Policy(name string, capacity int64, perSecond float64) (core.Policy, error) {
	if math.IsNaN(perSecond) || math.IsInf(perSecond, 0) || perSecond <= 0 {
		return core.Policy{}, driver.Errorf(core.ErrInvalidPolicy, "policy %q: refill rate %v per second must be a positive number", name, perSecond)
	}
	us := math.Round(1e6 / perSecond)
	if perSecond > 1e6 {
		return core.Policy{}, driver.Errorf(core.ErrInvalidPolicy, "policy %q: refill rate %v per second is above 1e6 per second", name, perSecond)
	}
	if us > float64(core.MaxInterval/time.Microsecond) {
		return core.Policy{}, driver.Errorf(core.ErrInvalidPolicy, "policy %q: refill rate %v per second is below one token per %v", name, perSecond, core.MaxInterval)
	}
	return driver.NewPolicy(name, Algorithm, capacity, time.Duration(us)*time.Microsecond)
}

// Rate is the refill rate that policy p enforces, in tokens per second.
func Rate(p core.Policy) float64 {
	return float64(time.Second) / float64(p.Interval())
}

func (algorithm) Name() string           { return Name }
func (algorithm) Script() *driver.Script { return script }
func (algorithm) NeedsID() bool          { return false }

func (algorithm) Validate(limit int64, interval time.Duration) error {
	t := int64(interval / time.Microsecond)
	if limit > MaxCredit/t {
		return driver.Errorf(core.ErrInvalidPolicy, "capacity %d × refill interval %v is beyond %d µs", limit, interval, int64(MaxCredit))
	}
	return nil
}

func (algorithm) Args(p core.Policy, cost int64, _ string, nowMicros int64) []string {
	// Room for the optional now and the deadline a caller appends
	// (driver.DeadlineArg): one allocation per call.
	args := append(make([]string, 0, 6),
		strconv.FormatInt(p.Limit(), 10),
		strconv.FormatInt(int64(p.Interval()/time.Microsecond), 10),
		strconv.FormatInt(cost, 10),
	)
	if nowMicros > 0 {
		args = append(args, strconv.FormatInt(nowMicros, 10))
	}
	return args
}

// State is a bucket: Credit microseconds of unspent refill as of Last
// (microseconds since the Unix epoch). Credit may be negative after a
// reconciliation charged an outage's grants: a debt.
//
// Credit refills one microsecond per microsecond, and that holds before Last
// too: at any instant x a bucket of full credit holds min(full, Credit + x −
// Last) (see At). A clock that reads earlier than Last finds less credit, so
// refill is never counted twice when a clock steps back. Two states with the
// same Empty are therefore the same bucket, and Redis stores only that number.
type State struct {
	Credit int64
	Last   int64
}

// Empty is the instant, in microseconds, at which the bucket held or will
// hold zero credit: Last − Credit. It is the integer Redis stores.
func (s State) Empty() int64 { return s.Last - s.Credit }

// At is the credit the bucket holds at instant x when a full bucket holds
// full: min(full, Credit + x − Last).
func (s State) At(x, full int64) int64 { return min(full, s.Credit+x-s.Last) }

// FromEmpty is the bucket whose Empty is e, as of instant x.
func FromEmpty(e, x, full int64) State { return State{Credit: min(full, x-e), Last: x} }

// Size is the state's size in bytes, for memory accounting.
func (State) Size() int64 { return 16 }

// Decide is the Go twin of tokenbucket.lua: given the bucket st (ok false
// when the key holds nothing), the time now in microseconds, the capacity c,
// the refill interval t in microseconds and the cost n, it returns the next
// state, whether it changed, and the script's reply.
func Decide(st State, ok bool, now, c, t, n int64) (next State, changed bool, reply [driver.ReplyLen]int64) {
	return DecideCredit(st, ok, now, c*t, t, n)
}

// DecideCredit is Decide for a bucket that holds at most full microseconds
// of credit and charges tokenCost microseconds a token. With full = C·T and
// tokenCost = N·T it is one instance's 1/N share of a bucket of capacity C
// and interval T: capacity C/N, refill rate 1/(N·T), fractions included.
func DecideCredit(st State, ok bool, now, full, tokenCost, n int64) (next State, changed bool, reply [driver.ReplyLen]int64) {
	credit, admit, remaining, retry := decide(st, ok, now, full, tokenCost, n)
	reply = [driver.ReplyLen]int64{0, remaining, retry, full - credit, now}
	if !admit {
		return st, false, reply
	}
	reply[0] = 1
	return State{Credit: credit, Last: now}, true, reply
}

// decide is the one decision every twin makes (Decide, DecideCredit, the
// memory store's steps): the bucket's credit after it, whether it admits,
// the tokens remaining and the retry time; the reply's reset time is full −
// credit. It returns scalars, which stay in registers.
func decide(st State, ok bool, now, full, tokenCost, n int64) (credit int64, admit bool, remaining, retry int64) {
	credit = full
	if ok {
		credit = st.At(now, full)
	}
	need := n * tokenCost
	if credit < need {
		if credit > 0 {
			remaining = credit / tokenCost
		}
		return credit, false, remaining, need - credit
	}
	credit -= need
	return credit, true, credit / tokenCost, 0
}

// local adapts Decide to driver.LocalFunc for the memory store.
func local(prev any, now int64, args []string) (any, []int64, int64, error) {
	if len(args) < 3 || len(args) > 4 {
		return prev, nil, 0, driver.Errorf(core.ErrInvalidPolicy, "%d script arguments, want 3 to 4", len(args))
	}
	var v [4]int64
	for i, a := range args {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return prev, nil, 0, driver.Errorf(core.ErrInvalidPolicy, "script argument %d: %v", i+1, err)
		}
		v[i] = n
	}
	c, t, n := v[0], v[1], v[2]
	if c < 1 || t < 1 || n < 1 || n > c {
		return prev, nil, 0, driver.Errorf(core.ErrInvalidPolicy, "token bucket: bad arguments %v", args)
	}
	if len(args) == 4 && v[3] > 0 {
		now = v[3]
	}
	next, credit, admit, remaining, retry := step(prev, prev != nil, now, c*t, t, n)
	allowed := int64(0)
	if admit {
		allowed = 1
	}
	return next, []int64{allowed, remaining, retry, c*t - credit, now}, c*t - credit, nil
}

// Step is the Go twin on typed arguments (driver.DirectAlgorithm): the
// decision local makes for ARGV Args(p, cost, "", 0).
func (algorithm) Step(p core.Policy, prev any, live bool, now, cost int64) (any, driver.Reply, int64) {
	t := int64(p.Interval() / time.Microsecond)
	full := p.Limit() * t
	next, credit, admit, remaining, retry := step(prev, live, now, full, t, cost)
	return next, driver.Reply{Allowed: admit, Remaining: remaining, RetryAfter: retry, ResetAfter: full - credit, Now: now}, full - credit
}

// step decides on the state the memory store holds: a *State, updated in
// place (or, when the key's state has expired, reused), so decisions on a
// key the store holds allocate nothing. prev is the key's state if live.
// The key lives full − credit microseconds, until the bucket is full again.
// (A denial needs a key that holds something: a fresh bucket admits any
// valid cost.)
func step(prev any, live bool, now, full, t, n int64) (next any, credit int64, admit bool, remaining, retry int64) {
	st, _ := prev.(*State)
	ok := live && st != nil
	var cur State
	if ok {
		cur = *st
	}
	credit, admit, remaining, retry = decide(cur, ok, now, full, t, n)
	if !admit {
		return prev, credit, false, remaining, retry
	}
	if st == nil {
		st = new(State)
	}
	st.Credit, st.Last = credit, now
	return st, credit, true, remaining, retry
}

// Package tokenbucket is the token bucket algorithm: a bucket of Capacity
// tokens refilled at a steady rate; a request of cost n is admitted when n
// tokens are in the bucket, and takes them.
//
// The bucket is stored as credit: the microseconds of refill time that have
// accrued and not been spent, capped at Capacity × T where T is the time to
// refill one token. Everything is integer arithmetic below 2^53, so the Lua
// script (tokenbucket.lua) and its Go twin (Decide) return identical answers.
package tokenbucket

import (
	_ "embed"
	"math"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/core"
)

// Name is the algorithm's config name.
const Name = "token_bucket"

// MaxCredit bounds Capacity × T, in microseconds, so every intermediate value
// of the script stays an exact integer in Lua's doubles.
const MaxCredit = 1 << 50

//go:embed tokenbucket.lua
var source string

var script = core.NewScript(Name, source, local)

type algorithm struct{}

// Algorithm is the token bucket as a core.Algorithm.
var Algorithm core.Algorithm = algorithm{}

// Policy returns a token bucket policy named name with the given capacity,
// refilled at perSecond tokens per second. The refill interval is rounded to
// a whole microsecond; Rate reports the rate actually enforced.
func Policy(name string, capacity int64, perSecond float64) (core.Policy, error) {
	if math.IsNaN(perSecond) || math.IsInf(perSecond, 0) || perSecond <= 0 {
		return core.Policy{}, core.Errorf(core.ErrInvalidPolicy, "policy %q: refill rate %v per second must be a positive number", name, perSecond)
	}
	us := math.Round(1e6 / perSecond)
	if perSecond > 1e6 {
		return core.Policy{}, core.Errorf(core.ErrInvalidPolicy, "policy %q: refill rate %v per second is above 1e6 per second", name, perSecond)
	}
	if us > float64(core.MaxInterval/time.Microsecond) {
		return core.Policy{}, core.Errorf(core.ErrInvalidPolicy, "policy %q: refill rate %v per second is below one token per %v", name, perSecond, core.MaxInterval)
	}
	return core.NewPolicy(name, Algorithm, capacity, time.Duration(us)*time.Microsecond)
}

// Rate is the refill rate that policy p enforces, in tokens per second.
func Rate(p core.Policy) float64 {
	return float64(time.Second) / float64(p.Interval())
}

func (algorithm) Name() string         { return Name }
func (algorithm) Script() *core.Script { return script }
func (algorithm) NeedsID() bool        { return false }

func (algorithm) Validate(limit int64, interval time.Duration) error {
	t := int64(interval / time.Microsecond)
	if limit > MaxCredit/t {
		return core.Errorf(core.ErrInvalidPolicy, "capacity %d × refill interval %v is beyond %d µs", limit, interval, int64(MaxCredit))
	}
	return nil
}

func (algorithm) Args(p core.Policy, cost int64, _ string, nowMicros int64) []string {
	args := []string{
		strconv.FormatInt(p.Limit(), 10),
		strconv.FormatInt(int64(p.Interval()/time.Microsecond), 10),
		strconv.FormatInt(cost, 10),
	}
	if nowMicros > 0 {
		args = append(args, strconv.FormatInt(nowMicros, 10))
	}
	return args
}

// State is a bucket: Credit microseconds of unspent refill as of Last
// (microseconds since the Unix epoch). Credit may be negative after a
// reconciliation charged an outage's grants: a debt.
type State struct {
	Credit int64
	Last   int64
}

// Size is the state's size in bytes, for memory accounting.
func (State) Size() int64 { return 16 }

// Decide is the Go twin of tokenbucket.lua: given the bucket st (ok false
// when the key holds nothing), the time now in microseconds, the capacity c,
// the refill interval t in microseconds and the cost n, it returns the next
// state, whether it changed, and the script's reply.
func Decide(st State, ok bool, now, c, t, n int64) (next State, changed bool, reply [core.ReplyLen]int64) {
	return DecideCredit(st, ok, now, c*t, t, n)
}

// DecideCredit is Decide for a bucket that holds at most full microseconds
// of credit and charges tokenCost microseconds a token. With full = C·T and
// tokenCost = N·T it is one instance's 1/N share of a bucket of capacity C
// and interval T: capacity C/N, refill rate 1/(N·T), fractions included.
func DecideCredit(st State, ok bool, now, full, tokenCost, n int64) (next State, changed bool, reply [core.ReplyLen]int64) {
	credit := full
	if ok {
		credit = st.Credit
		if now > st.Last {
			credit += now - st.Last
		}
		credit = min(credit, full)
	}
	need := n * tokenCost
	if credit < need {
		remaining := int64(0)
		if credit > 0 {
			remaining = credit / tokenCost
		}
		return st, false, [core.ReplyLen]int64{0, remaining, need - credit, full - credit, now}
	}
	credit -= need
	return State{Credit: credit, Last: now}, true, [core.ReplyLen]int64{1, credit / tokenCost, 0, full - credit, now}
}

// local adapts Decide to core.LocalFunc for the memory store.
func local(prev any, now int64, args []string) (any, []int64, int64, error) {
	v, err := core.ParseArgs(args, 3, 4)
	if err != nil {
		return prev, nil, 0, err
	}
	c, t, n := v[0], v[1], v[2]
	if c < 1 || t < 1 || n < 1 || n > c {
		return prev, nil, 0, core.Errorf(core.ErrInvalidPolicy, "token bucket: bad arguments %v", args)
	}
	if len(v) == 4 && v[3] > 0 {
		now = v[3]
	}
	st, ok := prev.(State)
	next, changed, r := Decide(st, ok, now, c, t, n)
	if !changed {
		ttl := int64(0)
		if ok {
			ttl = c*t - st.Credit - max(now-st.Last, 0)
		}
		return prev, r[:], max(ttl, 0), nil
	}
	return next, r[:], c*t - next.Credit, nil
}

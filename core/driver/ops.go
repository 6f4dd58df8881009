package driver

import "strconv"

// A Peeker is an Algorithm with a decision script that writes nothing: the
// same arguments (Args) and reply as Script, and the reply is what Script
// would answer at that moment.
type Peeker interface {
	Algorithm
	PeekScript() *Script
}

// A Refunder is an Algorithm whose admissions can be given back: AllowAll
// gives back what it spent on the requests admitted before one was denied.
type Refunder interface {
	Algorithm
	// RefundCall returns the script call that gives back, on storage key
	// skey, the cost units that the decision with request id id (empty
	// unless NeedsID) admitted with reply r. A refund never gives more
	// than a full quota, and a refund of units that have already left the
	// algorithm's window gives nothing.
	RefundCall(p Policy, skey string, cost int64, id string, r Reply) Call
}

// resetScript forgets a key: the next decision finds a full quota.
var resetScript = NewScript("reset", "redis.call('DEL', KEYS[1]) return {1}", func(any, int64, []string) (any, []int64, int64, error) {
	return nil, []int64{1}, 0, nil
})

// ResetScript is the script Reset runs on a storage key: DEL, so the next
// decision finds a full quota. fallback runs it too.
func ResetScript() *Script { return resetScript }

// RefundArgs formats the arguments of a refund call: integers in decimal,
// then the strings.
func RefundArgs(ints []int64, strs ...string) []string {
	args := make([]string, 0, len(ints)+len(strs))
	for _, v := range ints {
		args = append(args, strconv.FormatInt(v, 10))
	}
	return append(args, strs...)
}

// NewDecisionScripts returns an algorithm's decision script and its Peeker
// script from one Lua source that tests a global PEEK before it writes:
// decide runs it with PEEK false (NewDecisionScript: with the deadline
// guard), peek with PEEK true. local is the decision's Go twin; the peek's
// twin runs local on clone(prev), a copy of the state local may change in
// place, and leaves the store's state as it was.
func NewDecisionScripts(name, src string, local LocalFunc, clone func(prev any) any) (decide, peek *Script) {
	decide = NewDecisionScript(name, "local PEEK = false\n"+src, local)
	peek = NewScript(name+"_peek", "local NOW\nlocal PEEK = true\n"+src, func(prev any, now int64, args []string) (any, []int64, int64, error) {
		if prev != nil {
			prev = clone(prev)
		}
		_, r, _, err := local(prev, now, args)
		return nil, r, -1, err
	})
	return decide, peek
}

package core

import (
	"context"
	"strconv"
)

// The operations beside AllowN: Peek (what AllowN would answer, spending
// nothing), Reset (forget a key's usage) and AllowAll (several limits
// charged together, all or nothing). They need two capabilities of an
// algorithm, Peeker and Refunder; the built-in algorithms have both.

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

// A Request is one of the charges AllowAll makes: Cost units (0 means 1)
// of Policy for client Key.
type Request struct {
	Policy Policy
	Key    string
	Cost   int64
}

// Units is the request's cost: Cost, or 1 when Cost is 0.
func (r Request) Units() int64 {
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}

// MaxRequests is the most requests one AllowAll call takes.
const MaxRequests = 64

// CheckRequests validates the requests of an AllowAll call before any
// store is touched: at least one, at most MaxRequests, each valid
// (CheckRequest), and every policy a Peeker and a Refunder.
func CheckRequests(reqs []Request) error {
	if len(reqs) == 0 {
		return errorf(ErrInvalidPolicy, "AllowAll without a request")
	}
	if len(reqs) > MaxRequests {
		return errorf(ErrInvalidPolicy, "AllowAll of %d requests, at most %d", len(reqs), MaxRequests)
	}
	for i, r := range reqs {
		if err := CheckRequest(r.Policy, r.Key, r.Units()); err != nil {
			return err
		}
		if _, ok := r.Policy.alg.(Refunder); !ok {
			return errorf(ErrInvalidPolicy, "request %d: algorithm %s cannot refund, so it cannot be charged with others", i, r.Policy.alg.Name())
		}
		if _, ok := r.Policy.alg.(Peeker); !ok {
			return errorf(ErrInvalidPolicy, "request %d: algorithm %s cannot peek", i, r.Policy.alg.Name())
		}
	}
	return nil
}

// AllAllowed reports whether every Result admits: the answer of AllowAll.
func AllAllowed(rs []Result) bool {
	for _, r := range rs {
		if !r.Allowed {
			return false
		}
	}
	return len(rs) > 0
}

// Denied returns the index of the first Result that denies, or -1.
func Denied(rs []Result) int {
	for i, r := range rs {
		if !r.Allowed {
			return i
		}
	}
	return -1
}

// A MultiDecider charges several limits at once, all or nothing, as
// Limiter and fallback.Limiter do.
type MultiDecider interface {
	Decider
	AllowAll(ctx context.Context, reqs ...Request) ([]Result, error)
}

var _ MultiDecider = (*Limiter)(nil)

// resetScript forgets a key: the next decision finds a full quota.
var resetScript = NewScript("reset", "redis.call('DEL', KEYS[1]) return {1}", func(any, int64, []string) (any, []int64, int64, error) {
	return nil, []int64{1}, 0, nil
})

// ResetScript is the script Reset runs on a storage key: DEL, so the next
// decision finds a full quota. fallback runs it too.
func ResetScript() *Script { return resetScript }

// Reset forgets key's usage of policy p: its next request finds a full
// quota.
func (l *Limiter) Reset(ctx context.Context, p Policy, key string) error {
	if ctx == nil {
		return ErrNilContext
	}
	if err := CheckRequest(p, key, 1); err != nil {
		return err
	}
	_, err := l.store.Run(ctx, resetScript, []string{l.Key(p, key)}, nil)
	return err
}

// Peek returns what AllowN(ctx, p, key, cost) would answer now, spending
// nothing.
func (l *Limiter) Peek(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	if ctx == nil {
		return Result{}, ErrNilContext
	}
	if err := CheckRequest(p, key, cost); err != nil {
		return Result{}, err
	}
	pk, ok := p.alg.(Peeker)
	if !ok {
		return Result{}, errorf(ErrInvalidPolicy, "algorithm %s cannot peek", p.alg.Name())
	}
	var id string
	if p.alg.NeedsID() {
		id = l.newID()
	}
	raw, err := l.store.Run(ctx, pk.PeekScript(), []string{l.Key(p, key)}, p.alg.Args(p, cost, id, 0))
	if err != nil {
		return Result{}, err
	}
	r, err := ParseReply(raw)
	if err != nil {
		return Result{}, err
	}
	return l.result(p, r), nil
}

// AllowAll charges every request, all or nothing: it admits only if each
// request's policy admits it, and when one denies, none of the others is
// spent. It returns one Result per request, in order; the answer is
// AllAllowed of them (Denied gives the first that denied).
//
// The requests are decided in order, and at the first denial the ones
// before it are refunded (Refunder) and the ones after it peeked. Each
// Result is what AllowN of that request alone answered or would answer:
// for a request refunded or not spent, Allowed and the Remaining after its
// cost, though nothing of it was spent. Each policy's bound holds under any
// concurrency, since each decision is atomic in the store; between a
// request's charge and its refund another may find that policy's quota
// lower, so under contention AllowAll can deny what a later moment would
// admit, never the reverse. A refund the store does not take leaves that
// charge spent: an under-admission, never more admitted. A store error on
// a charge is returned (after the refunds) without Results.
//
// Put the policy most likely to deny first: a denial of the first request
// costs one store call, of a later one a refund per earlier request.
func (l *Limiter) AllowAll(ctx context.Context, reqs ...Request) ([]Result, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if err := CheckRequests(reqs); err != nil {
		return nil, err
	}
	rs := make([]Result, len(reqs))
	type spent struct {
		id  string
		rep Reply
	}
	done := make([]spent, 0, len(reqs))
	for i, q := range reqs {
		var id string
		if q.Policy.alg.NeedsID() {
			id = l.newID()
		}
		rep, err := l.run(ctx, q.Policy, q.Key, q.Units(), id)
		if err == nil && rep.Allowed {
			rs[i] = l.result(q.Policy, rep)
			done = append(done, spent{id, rep})
			continue
		}
		// Denied, or the store failed: give back what was spent.
		l.refund(ctx, reqs[:i], func(j int) (string, Reply) { return done[j].id, done[j].rep })
		if err != nil {
			return nil, err
		}
		rs[i] = l.result(q.Policy, rep)
		for j := i + 1; j < len(reqs); j++ {
			if rs[j], err = l.Peek(ctx, reqs[j].Policy, reqs[j].Key, reqs[j].Units()); err != nil {
				return nil, err
			}
		}
		return rs, nil
	}
	return rs, nil
}

// refund gives back the charges of reqs, the ith admitted as spent(i)
// tells. A refund the store does not take leaves its charge spent.
func (l *Limiter) refund(ctx context.Context, reqs []Request, spent func(i int) (string, Reply)) {
	for i, q := range reqs {
		id, rep := spent(i)
		c := q.Policy.alg.(Refunder).RefundCall(q.Policy, l.Key(q.Policy, q.Key), q.Units(), id, rep)
		_, _ = l.store.Run(ctx, c.Script, c.Keys, c.Args) // a failure leaves the charge spent
	}
}

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
	peek = NewScript(name+"_peek", "local PEEK = true\n"+src, func(prev any, now int64, args []string) (any, []int64, int64, error) {
		if prev != nil {
			prev = clone(prev)
		}
		_, r, _, err := local(prev, now, args)
		return nil, r, -1, err
	})
	return decide, peek
}

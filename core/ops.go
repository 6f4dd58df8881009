package core

import (
	"context"
	"github.com/holdfast/holdfast/core/driver"
)

// The operations beside AllowN: Peek (what AllowN would answer, spending
// nothing), Reset (forget a key's usage) and AllowAll (several limits
// charged together, all or nothing). They need two capabilities of an
// algorithm, Peeker and Refunder; the built-in algorithms have both.

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
		if err := driver.CheckRequest(r.Policy, r.Key, r.Units()); err != nil {
			return err
		}
		if _, ok := r.Policy.Algorithm().(driver.Refunder); !ok {
			return errorf(ErrInvalidPolicy, "request %d: algorithm %s cannot refund, so it cannot be charged with others", i, r.Policy.Algorithm().Name())
		}
		if _, ok := r.Policy.Algorithm().(driver.Peeker); !ok {
			return errorf(ErrInvalidPolicy, "request %d: algorithm %s cannot peek", i, r.Policy.Algorithm().Name())
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

// Governing returns the index of the Result that speaks for an AllowAll
// to a client (its Retry-After, its X-RateLimit fields): the first that
// denies, or when all admit the one with the least remaining. rs must not
// be empty.
func Governing(rs []Result) int {
	if d := Denied(rs); d >= 0 {
		return d
	}
	g := 0
	for i := range rs {
		if rs[i].Remaining < rs[g].Remaining {
			g = i
		}
	}
	return g
}

// A MultiDecider charges several limits at once, all or nothing, as
// Limiter and fallback.Limiter do.
type MultiDecider interface {
	Decider
	AllowAll(ctx context.Context, reqs ...Request) ([]Result, error)
}

var _ MultiDecider = (*Limiter)(nil)

// Reset forgets key's usage of policy p: its next request finds a full
// quota.
func (l *Limiter) Reset(ctx context.Context, p Policy, key string) error {
	if ctx == nil {
		return ErrNilContext
	}
	if err := driver.CheckRequest(p, key, 1); err != nil {
		return err
	}
	_, err := l.store.Run(ctx, driver.ResetScript(), []string{l.Key(p, key)}, nil)
	return err
}

// Peek returns what AllowN(ctx, p, key, cost) would answer now, spending
// nothing.
func (l *Limiter) Peek(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	if ctx == nil {
		return Result{}, ErrNilContext
	}
	if err := driver.CheckRequest(p, key, cost); err != nil {
		return Result{}, err
	}
	pk, ok := p.Algorithm().(driver.Peeker)
	if !ok {
		return Result{}, errorf(ErrInvalidPolicy, "algorithm %s cannot peek", p.Algorithm().Name())
	}
	var id string
	if p.Algorithm().NeedsID() {
		id = l.newID()
	}
	raw, err := l.store.Run(ctx, pk.PeekScript(), []string{l.Key(p, key)}, p.Algorithm().Args(p, cost, id, 0))
	if err != nil {
		return Result{}, err
	}
	r, err := driver.ParseReply(raw)
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
		rep driver.Reply
	}
	done := make([]spent, 0, len(reqs))
	for i, q := range reqs {
		var id string
		if q.Policy.Algorithm().NeedsID() {
			id = l.newID()
		}
		rep, err := l.run(ctx, q.Policy, q.Key, q.Units(), id)
		if err == nil && rep.Allowed {
			rs[i] = l.result(q.Policy, rep)
			done = append(done, spent{id, rep})
			continue
		}
		// Denied, or the store failed: give back what was spent.
		l.refund(ctx, reqs[:i], func(j int) (string, driver.Reply) { return done[j].id, done[j].rep })
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
func (l *Limiter) refund(ctx context.Context, reqs []Request, spent func(i int) (string, driver.Reply)) {
	for i, q := range reqs {
		id, rep := spent(i)
		c := q.Policy.Algorithm().(driver.Refunder).RefundCall(q.Policy, l.Key(q.Policy, q.Key), q.Units(), id, rep)
		_, _ = l.store.Run(ctx, c.Script, c.Keys, c.Args) // a failure leaves the charge spent
	}
}

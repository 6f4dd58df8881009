package driver

import "time"

// The capabilities below are what the fallback and reconcile layers, the
// config loader and the HTTP middleware ask of an algorithm. Each is a small
// interface an Algorithm implements next to its decision script and Go twin,
// and the layers find it by type assertion, as database/sql finds a
// driver's optional interfaces: none of them branches on an algorithm's
// name, so adding an algorithm is adding its package (and registering it,
// see Register).

// A Quotaer is an Algorithm that says how a policy's quota reads to a
// client and to an operator: the q and w of the IETF RateLimit-Policy
// field, and the most one exact limiter admits over a span.
type Quotaer interface {
	Algorithm
	// Quota returns the quota units and the window they are given over:
	// a token bucket's capacity over the time it takes to refill it, a
	// window's limit over its length.
	Quota(p Policy) (units int64, window time.Duration)
	// Bound returns what one exact limiter of p admits, over a span d, to
	// a client asking above the limit all the time: ideal from the span's
	// start (the least, where that depends on where the span starts
	// against the algorithm's windows), most over any span of length d.
	Bound(p Policy, d time.Duration) (ideal, most float64)
	// Describe returns a short text such as "token bucket 20 + 5/s".
	Describe(p Policy) string
}

// A Leaser is an Algorithm that can limit a key locally, with one
// instance's 1/n share of its policy, while the store is unavailable.
type Leaser interface {
	Algorithm
	// Observe returns what the reply r to a decision of cost units on p
	// tells of the key's state, given known, the Seed the instance's
	// previous reply on the key gave (zero when none): the seed a later
	// lease starts from, and a replay into a store that lost the key. A
	// Seed with At 0 means nothing is known. An algorithm whose one reply
	// does not tell its whole state (the sliding window counter's estimate
	// mixes two windows) folds known into the new seed; the cost tells
	// what a denial's retry time means.
	Observe(p Policy, known Seed, cost int64, r Reply) Seed
	// NewLease returns a lease of p that starts from seed at store time
	// now (µs); a zero seed starts from a full quota.
	NewLease(p Policy, seed Seed, now int64) Lease
	// LoadLease decodes a lease that Lease.AppendBinary wrote for p.
	LoadLease(p Policy, data []byte) (Lease, error)
}

// A Lease is one key's local share of a policy during an outage. The
// caller serialises the calls on one lease (the key's lock).
type Lease interface {
	// Decide decides a request of cost units under the 1/n share of p at
	// store time now (µs), spends the cost if it is admitted, and returns
	// the reply in units of the share.
	Decide(p Policy, n, now, cost int64) Reply
	// Charge spends a grant of cost units made at store time at, whatever
	// the lease holds: a grant read back from the state dir.
	Charge(p Policy, n, at, cost int64)
	// AppendBinary appends the lease's state to b, for the state dir.
	AppendBinary(b []byte) []byte
	// Size is the lease's approximate size in bytes.
	Size() int64
}

// ReplyOf is the Reply of a script's five integers.
func ReplyOf(r [ReplyLen]int64) Reply {
	return Reply{Allowed: r[0] == 1, Remaining: r[1], RetryAfter: r[2], ResetAfter: r[3], Now: r[4]}
}

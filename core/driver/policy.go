package driver

import (
	"fmt"
	"time"
)

// Bounds on policy numbers. They keep every intermediate value of the
// algorithms below 2^53, where Lua's doubles and Go's int64 agree exactly.
const (
	// MaxLimit is the largest capacity or limit a policy may have.
	MaxLimit = 1_000_000_000
	// MaxInterval is the longest refill interval or window a policy may have.
	MaxInterval = 366 * 24 * time.Hour
	// MinInterval is the shortest refill interval or window: one microsecond,
	// the resolution of Redis TIME.
	MinInterval = time.Microsecond
	// MaxPolicyName is the longest policy name, in bytes.
	MaxPolicyName = 64
)

// An Algorithm is a rate-limiting algorithm: its decision script (Lua and Go
// twin) and how a policy's numbers become the script's arguments.
// Implementations live in the algorithms/ packages.
type Algorithm interface {
	// Name is the algorithm's config name, such as "token_bucket".
	Name() string
	// Validate checks the policy numbers beyond the generic bounds that
	// NewPolicy enforces. It returns an error wrapping ErrInvalidPolicy.
	Validate(limit int64, interval time.Duration) error
	// Script is the decision step.
	Script() *Script
	// Args returns the decision script's ARGV for one request. id is a
	// unique request id when NeedsID reports true, else empty. A nowMicros of
	// zero lets the store use its own clock.
	Args(p Policy, cost int64, id string, nowMicros int64) []string
	// NeedsID reports whether each decision needs a unique request id.
	NeedsID() bool
}

// A Policy is a validated limit: an algorithm with its numbers. The zero
// Policy is invalid. Build one with its algorithm package's constructor, in
// the units a limit is thought of in: tokenbucket.Policy(name, capacity,
// perSecond), slidingwindow.Policy(name, limit, window) or
// slidingcounter.Policy(name, limit, window); a config file gives the same
// numbers (package config).
type Policy struct {
	name     string
	alg      Algorithm
	limit    int64
	interval time.Duration
}

// NewPolicy is the constructor an algorithm package's own builds on (and
// what a state dir's records are read back with): it checks the name, the
// ranges and alg.Validate. limit and interval mean what alg says: for the
// token bucket the capacity and the time to refill one token, for the
// sliding windows the limit and the window. Applications use the algorithm
// package's constructor instead.
func NewPolicy(name string, alg Algorithm, limit int64, interval time.Duration) (Policy, error) {
	if err := checkName(name); err != nil {
		return Policy{}, err
	}
	if alg == nil {
		return Policy{}, errorf(ErrInvalidPolicy, "policy %q has no algorithm", name)
	}
	if limit <= 0 || limit > MaxLimit {
		return Policy{}, errorf(ErrInvalidPolicy, "policy %q: limit %d out of range [1, %d]", name, limit, MaxLimit)
	}
	if interval < MinInterval || interval > MaxInterval {
		return Policy{}, errorf(ErrInvalidPolicy, "policy %q: interval %v out of range [%v, %v]", name, interval, MinInterval, MaxInterval)
	}
	if interval%time.Microsecond != 0 {
		return Policy{}, errorf(ErrInvalidPolicy, "policy %q: interval %v is finer than a microsecond", name, interval)
	}
	if err := alg.Validate(limit, interval); err != nil {
		return Policy{}, fmt.Errorf("policy %q: %w", name, err)
	}
	return Policy{name: name, alg: alg, limit: limit, interval: interval}, nil
}

// checkName accepts names made of letters, digits, '_', '-' and '.': a name
// is part of every storage key, so it may not contain the key separator ':'
// or the hash-tag braces.
func checkName(name string) error {
	if name == "" {
		return errorf(ErrInvalidPolicy, "empty policy name")
	}
	if len(name) > MaxPolicyName {
		return errorf(ErrInvalidPolicy, "policy name %.20q... longer than %d bytes", name, MaxPolicyName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
		if !ok {
			return errorf(ErrInvalidPolicy, "policy name %q: byte %q not allowed (use letters, digits, '_', '-', '.')", name, c)
		}
	}
	return nil
}

// Name is the policy's name; it is part of every storage key.
func (p Policy) Name() string { return p.name }

// Algorithm is the policy's algorithm.
func (p Policy) Algorithm() Algorithm { return p.alg }

// Limit is the token bucket's capacity or the sliding window's limit.
func (p Policy) Limit() int64 { return p.limit }

// Interval is the token bucket's time to refill one token or the sliding
// window's length.
func (p Policy) Interval() time.Duration { return p.interval }

// Valid reports whether p was built by NewPolicy.
func (p Policy) Valid() bool { return p.alg != nil }

// String describes the policy, e.g. "api(token_bucket 20 per 200ms)".
func (p Policy) String() string {
	if p.alg == nil {
		return "invalid-policy"
	}
	return fmt.Sprintf("%s(%s %d per %v)", p.name, p.alg.Name(), p.limit, p.interval)
}

// CheckCost reports whether cost is a valid request cost for p.
func (p Policy) CheckCost(cost int64) error {
	if cost <= 0 {
		return errorf(ErrInvalidCost, "cost %d must be at least 1", cost)
	}
	if cost > p.limit {
		return errorf(ErrCostExceedsLimit, "cost %d above policy %s limit %d", cost, p.name, p.limit)
	}
	return nil
}

// Policies is a set of policies by name.
type Policies map[string]Policy

// Lookup returns the policy called name, or an error wrapping ErrUnknownPolicy.
func (ps Policies) Lookup(name string) (Policy, error) {
	p, ok := ps[name]
	if !ok {
		return Policy{}, errorf(ErrUnknownPolicy, "no policy named %q", name)
	}
	return p, nil
}

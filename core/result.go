package core

import (
	"errors"
	"time"
)

// Mode says which path decided a request.
type Mode int

const (
	// ModeNone is the zero Mode: nothing decided (the Result of an error).
	ModeNone Mode = iota
	// ModeRedis: the shared store (Redis) decided, for all instances at once.
	ModeRedis
	// ModeLocal: this process decided alone, from a local store or a lease.
	ModeLocal
	// ModeFailOpen: the store was unavailable and the policy admits everything.
	ModeFailOpen
	// ModeFailClosed: the store was unavailable and the policy denies everything.
	ModeFailClosed
)

// String returns "none", "redis", "local", "fail_open" or "fail_closed".
func (m Mode) String() string {
	switch m {
	case ModeNone:
		return "none"
	case ModeRedis:
		return "redis"
	case ModeLocal:
		return "local"
	case ModeFailOpen:
		return "fail_open"
	case ModeFailClosed:
		return "fail_closed"
	}
	return "unknown"
}

// Result is one decision. A denial is a Result with Allowed false, never an
// error.
type Result struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Limit is the policy's capacity or limit as enforced for this decision
	// (in degraded mode, this instance's share).
	Limit int64
	// Remaining is what the key may still spend now.
	Remaining int64
	// RetryAfter is how long a denied request should wait before the same
	// cost can be admitted; zero when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back to its full quota if it
	// spends nothing more.
	ResetAfter time.Duration
	// Mode says which path decided.
	Mode Mode
	// Degraded reports that the shared store was not consulted because it is
	// failing; the decision used this instance's share of the quota.
	Degraded bool
}

// FromStore reports whether err is the store's failure rather than the
// request's: a *StoreError, any error outside the request class, or a key
// holding the wrong type. Middleware decides such a request by its outage
// mode (OutageResult) instead of failing it.
func FromStore(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := errors.AsType[*StoreError](err); ok {
		return true
	}
	return ClassOf(err) != ClassRequest || errors.Is(err, ErrWrongType)
}

// OutageResult is the decision on a request that a store failure left
// undecided, for a policy of limit units: admitted with the whole limit
// (ModeFailOpen), or with failClosed denied for a second (ModeFailClosed).
func OutageResult(limit int64, failClosed bool) Result {
	if failClosed {
		return Result{Limit: limit, RetryAfter: time.Second, Mode: ModeFailClosed, Degraded: true}
	}
	return Result{Allowed: true, Limit: limit, Remaining: limit, Mode: ModeFailOpen, Degraded: true}
}

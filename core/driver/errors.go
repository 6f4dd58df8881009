package driver

import (
	"context"
	"errors"
)

// Errors returned by holdfast. Each is wrapped with the detail that names the
// problem, so callers test them with errors.Is.
var (
	// ErrInvalidPolicy reports policy numbers that cannot describe a limit:
	// zero, negative, NaN or absurdly large values, or a zero Policy.
	ErrInvalidPolicy = errors.New("core: invalid policy")
	// ErrUnknownPolicy reports a policy name that no registry holds.
	ErrUnknownPolicy = errors.New("core: unknown policy")
	// ErrInvalidCost reports a cost of zero or less.
	ErrInvalidCost = errors.New("core: invalid cost")
	// ErrCostExceedsLimit reports a cost above the policy's capacity or limit:
	// such a request could never be admitted.
	ErrCostExceedsLimit = errors.New("core: cost exceeds policy limit")
	// ErrEmptyKey reports an empty client key.
	ErrEmptyKey = errors.New("core: empty key")
	// ErrKeyTooLong reports a client key longer than MaxKeyLen bytes.
	ErrKeyTooLong = errors.New("core: key too long")
	// ErrMalformedReply reports a store reply of the wrong shape or type.
	ErrMalformedReply = errors.New("core: malformed store reply")
	// ErrWrongType reports a storage key that holds another Redis type than
	// the algorithm's (WRONGTYPE), usually a key-prefix collision.
	ErrWrongType = errors.New("core: key holds the wrong type")
	// ErrNilContext reports a nil context.Context passed to a limiter or a
	// store.
	ErrNilContext = errors.New("core: nil context")
	// ErrStoreUnavailable reports a store that could not be reached or did
	// not answer within its deadline.
	ErrStoreUnavailable = errors.New("core: store unavailable")
)

// ErrorClass is what a failed store call means to a limiter: whether the
// request is wrong, or the store cannot serve it now.
type ErrorClass uint8

// The error classes, as ClassOf reports them. Every class but ClassRequest
// is an outage to a limiter that survives its store: the circuit breaker
// counts it and the policy's outage mode decides the request.
const (
	// ClassNone is the class of a nil error.
	ClassNone ErrorClass = iota
	// ClassRequest is a request the store cannot run as asked (its key
	// holds another type, or the request failed core's checks). It is
	// returned to the caller: asking again, or locally, would not help.
	ClassRequest
	// ClassUnavailable is a store that cannot serve now: not reached, no
	// answer within the deadline, or an error reply that says so (OOM,
	// READONLY, LOADING, BUSY, NOPERM, WRONGPASS, …; see docs/errors.md).
	ClassUnavailable
	// ClassUnknown is a failure holdfast does not recognise: an
	// unexpected error reply or a malformed reply. It fails safe, as
	// ClassUnavailable does, and is logged with its text.
	ClassUnknown
)

// String returns "none", "request", "unavailable" or "unknown".
func (c ErrorClass) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassRequest:
		return "request"
	case ClassUnavailable:
		return "unavailable"
	}
	return "unknown"
}

// A StoreError is a failed store call with its class and a short reason
// from a fixed set: the Redis error code for an error reply holdfast
// knows ("OOM", "READONLY", "NOPERM", …, "MAXCLIENTS"), "network" or
// "deadline" when no reply came, "malformed" for a reply of the wrong
// shape, "unknown" otherwise. The reason is safe as a metric label; the
// message text is not (it may name keys).
type StoreError struct {
	Class  ErrorClass
	Reason string
	// Answered is true when the store sent an error reply: the call
	// reached it and was refused, so it applied nothing (its outcome is
	// known). A call with no reply has an unknown outcome.
	Answered bool
	// Err is the cause, naming the script or command.
	Err error
}

func (e *StoreError) Error() string {
	switch e.Class {
	case ClassUnavailable:
		return ErrStoreUnavailable.Error() + " (" + e.Reason + "): " + e.Err.Error()
	case ClassRequest:
		return e.Err.Error()
	}
	return "core: store error (" + e.Reason + "): " + e.Err.Error()
}

// Unwrap returns the cause and, for the classes that have one, core's
// sentinel: ErrStoreUnavailable or ErrWrongType.
func (e *StoreError) Unwrap() []error {
	switch e.Class {
	case ClassUnavailable:
		return []error{ErrStoreUnavailable, e.Err}
	case ClassRequest:
		if e.Reason == "WRONGTYPE" {
			return []error{ErrWrongType, e.Err}
		}
	}
	return []error{e.Err}
}

// ClassOf returns the class of err: a StoreError's own, ClassRequest for
// core's request errors, ClassUnavailable for ErrStoreUnavailable and for a
// context that ended, ClassUnknown for anything else (ErrMalformedReply
// included).
func ClassOf(err error) ErrorClass {
	if err == nil {
		return ClassNone
	}
	if se, ok := errors.AsType[*StoreError](err); ok {
		return se.Class
	}
	for _, e := range requestErrors {
		if errors.Is(err, e) {
			return ClassRequest
		}
	}
	if errors.Is(err, ErrStoreUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return ClassUnavailable
	}
	return ClassUnknown
}

// ReasonOf returns err's reason (see StoreError) or, for an error that is
// not a StoreError, one derived from its class: "request", "network",
// "malformed" or "unknown". It is "" for nil.
func ReasonOf(err error) string {
	if err == nil {
		return ""
	}
	if se, ok := errors.AsType[*StoreError](err); ok {
		return se.Reason
	}
	switch {
	case errors.Is(err, ErrMalformedReply):
		return "malformed"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	switch ClassOf(err) {
	case ClassRequest:
		return "request"
	case ClassUnavailable:
		return "network"
	}
	return "unknown"
}

var requestErrors = []error{
	ErrWrongType, ErrInvalidPolicy, ErrUnknownPolicy, ErrInvalidCost,
	ErrCostExceedsLimit, ErrEmptyKey, ErrKeyTooLong, ErrNilContext,
}

package core

import "github.com/holdfast/holdfast/core/driver"

// What an application names from the driver level: a policy, the limits
// of its numbers, and the errors with their classes. They are the same
// types and values as package driver's, so errors.Is and errors.As see
// through either name.

// A Policy is a validated limit: an algorithm with its numbers. The zero
// Policy is invalid. Build one with its algorithm package's constructor, in
// the units a limit is thought of in: tokenbucket.Policy(name, capacity,
// perSecond), slidingwindow.Policy(name, limit, window) or
// slidingcounter.Policy(name, limit, window); a config file gives the same
// numbers (package config).
type Policy = driver.Policy

// Policies maps names to policies (a config's registry).
type Policies = driver.Policies

// Bounds of a policy's numbers and of a client key.
const (
	MaxLimit    = driver.MaxLimit
	MinInterval = driver.MinInterval
	MaxInterval = driver.MaxInterval
	MaxKeyLen   = driver.MaxKeyLen
)

// The errors a decision returns; test them with errors.Is.
var (
	ErrInvalidPolicy    = driver.ErrInvalidPolicy
	ErrUnknownPolicy    = driver.ErrUnknownPolicy
	ErrInvalidCost      = driver.ErrInvalidCost
	ErrCostExceedsLimit = driver.ErrCostExceedsLimit
	ErrEmptyKey         = driver.ErrEmptyKey
	ErrKeyTooLong       = driver.ErrKeyTooLong
	ErrNilContext       = driver.ErrNilContext
	ErrStoreUnavailable = driver.ErrStoreUnavailable
	ErrMalformedReply   = driver.ErrMalformedReply
	ErrWrongType        = driver.ErrWrongType
)

// ErrorClass says whose fault an error is: the request's, a store that
// cannot serve now, or a failure holdfast does not recognise.
type ErrorClass = driver.ErrorClass

// The error classes (ClassOf).
const (
	ClassNone        = driver.ClassNone
	ClassRequest     = driver.ClassRequest
	ClassUnavailable = driver.ClassUnavailable
	ClassUnknown     = driver.ClassUnknown
)

// StoreError is a store's failure with its class and a bounded reason
// (docs/errors.md).
type StoreError = driver.StoreError

// ClassOf returns err's class: ClassNone for nil.
func ClassOf(err error) ErrorClass { return driver.ClassOf(err) }

// ReasonOf returns err's bounded reason: a Redis error code such as "OOM",
// or "network", "deadline", "malformed", "unknown"; "" for nil.
func ReasonOf(err error) string { return driver.ReasonOf(err) }

// errorf wraps sentinel with a message, as driver.Errorf does.
func errorf(sentinel error, format string, args ...any) error {
	return driver.Errorf(sentinel, format, args...)
}

package core

import "errors"

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
	// ErrStoreUnavailable reports a store that could not be reached or did
	// not answer within its deadline.
	ErrStoreUnavailable = errors.New("core: store unavailable")
)

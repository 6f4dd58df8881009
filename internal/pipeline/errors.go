package pipeline

import (
	"fmt"
	"strings"

	"github.com/holdfast/holdfast/core"
)

// Errors maps a Redis client's errors onto core's errors, for Run and
// RunMany alike.
type Errors struct {
	// Prefix starts an error that is none of core's: "goredis".
	Prefix string
	// IsNil reports whether err is the client's nil reply.
	IsNil func(err error) bool
	// Reply returns the text of err, as the client gives it, when err is a
	// Redis error reply, and whether it is one.
	Reply func(err error) (msg string, ok bool)
	// Unavailable are the starts of the error replies that mean the server
	// cannot serve now (loading its data set, busy in a script, failing
	// over), not that the request is wrong.
	Unavailable []string
}

// Classify maps err, the failure of script or command name, onto core's
// errors, keeping the cause. Any error that is not a Redis error reply
// (network, deadline, context, pool, closed client) means the store is
// unavailable.
func (e *Errors) Classify(name string, err error) error {
	if e.IsNil(err) {
		return core.Errorf(core.ErrMalformedReply, "script %s: nil reply, want an array of integers", name)
	}
	msg, ok := e.Reply(err)
	if !ok {
		return fmt.Errorf("%w: %s: %w", core.ErrStoreUnavailable, name, err)
	}
	if strings.Contains(msg, "WRONGTYPE") {
		return fmt.Errorf("%w: %s: %w", core.ErrWrongType, name, err)
	}
	for _, p := range e.Unavailable {
		if strings.HasPrefix(msg, p) {
			return fmt.Errorf("%w: %s: %w", core.ErrStoreUnavailable, name, err)
		}
	}
	return fmt.Errorf("%s: %s: %w", e.Prefix, name, err)
}

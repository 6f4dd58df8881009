package pipeline

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Errors maps a Redis client's errors onto core's errors, for Run and
// RunMany alike. The table of what each error reply means is one for every
// client: see Refusals and docs/errors.md.
type Errors struct {
	// Prefix starts an error that is none of core's: "goredis".
	Prefix string
	// IsNil reports whether err is the client's nil reply.
	IsNil func(err error) bool
	// Reply returns the text of err, as the client gives it, when err is a
	// Redis error reply, and whether it is one.
	Reply func(err error) (msg string, ok bool)
}

// Refusals are the error codes with which a Redis server says that it
// cannot serve now, not that the request is wrong, each with the reason
// it is reported under. An error reply's code is its first word; a client
// that strips a leading "ERR " (rueidis) is matched the same way.
var Refusals = map[string]string{
	"OOM":         "OOM",         // maxmemory reached with a noeviction policy
	"READONLY":    "READONLY",    // a replica: writes refused
	"LOADING":     "LOADING",     // loading its data set after a restart
	"BUSY":        "BUSY",        // running a script past busy-reply-threshold
	"MASTERDOWN":  "MASTERDOWN",  // a replica that lost its master, replica-serve-stale-data no
	"CLUSTERDOWN": "CLUSTERDOWN", // a cluster without quorum or slot coverage
	"TRYAGAIN":    "TRYAGAIN",    // a cluster slot migrating
	"MISCONF":     "MISCONF",     // RDB snapshots failing, stop-writes-on-bgsave-error
	"NOREPLICAS":  "NOREPLICAS",  // min-replicas-to-write not met
	"NOPERM":      "NOPERM",      // an ACL that denies the command or key
	"NOAUTH":      "NOAUTH",      // authentication required
	"WRONGPASS":   "WRONGPASS",   // wrong user or password
	"STALE":       "STALE",       // holdfast's guard: the call ran after its deadline
}

// refusalTexts are refusals without a code of their own, found by their
// text.
var refusalTexts = []struct{ text, reason string }{
	{"max number of clients reached", "MAXCLIENTS"},
	{"invalid password", "WRONGPASS"},
	{"without any password configured", "WRONGPASS"},
	{"no password is set", "WRONGPASS"},
}

// Classify maps err, the failure of script or command name, onto a
// *core.StoreError, keeping the cause:
//   - a WRONGTYPE reply: core.ClassRequest, returned to the caller;
//   - a refusal (Refusals) or any error that is not a Redis error reply
//     (network, deadline, context, pool, closed client):
//     core.ClassUnavailable;
//   - a nil reply or any other error reply: core.ClassUnknown.
func (e *Errors) Classify(name string, err error) error {
	if e.IsNil(err) {
		return &core.StoreError{Class: core.ClassUnknown, Reason: "malformed", Answered: true,
			Err: driver.Errorf(core.ErrMalformedReply, "%s: %s: nil reply, want an array of integers", e.Prefix, name)}
	}
	cause := wrap(e.Prefix, name, err)
	msg, ok := e.Reply(err)
	if !ok {
		return &core.StoreError{Class: core.ClassUnavailable, Reason: transportReason(err), Err: cause}
	}
	class, reason := ClassifyReply(msg)
	return &core.StoreError{Class: class, Reason: reason, Answered: true, Err: cause}
}

// ClassifyReply returns the class and reason of the Redis error reply msg.
func ClassifyReply(msg string) (core.ErrorClass, string) {
	if strings.Contains(msg, "WRONGTYPE") {
		return core.ClassRequest, "WRONGTYPE"
	}
	code := strings.TrimPrefix(msg, "ERR ")
	if i := strings.IndexByte(code, ' '); i >= 0 {
		code = code[:i]
	}
	if r, ok := Refusals[code]; ok {
		return core.ClassUnavailable, r
	}
	for _, rt := range refusalTexts {
		if strings.Contains(msg, rt.text) {
			return core.ClassUnavailable, rt.reason
		}
	}
	return core.ClassUnknown, "unknown"
}

// transportReason is "deadline" for an error that is a timeout, "canceled"
// for a canceled context, else "network".
func transportReason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "network"
}

// wrappedError is "prefix: name: err", unwrapping to err.
type wrappedError struct {
	text string
	err  error
}

func (w *wrappedError) Error() string { return w.text }
func (w *wrappedError) Unwrap() error { return w.err }

func wrap(prefix, name string, err error) error {
	return &wrappedError{text: prefix + ": " + name + ": " + err.Error(), err: err}
}

// KnownReason reports whether r is one of the reasons a StoreError from
// Classify or core.ReasonOf can carry: the bounded set a metric label may
// take.
func KnownReason(r string) bool {
	switch r {
	case "WRONGTYPE", "MAXCLIENTS", "unknown", "malformed", "network", "deadline", "canceled", "request":
		return true
	}
	_, ok := Refusals[r]
	return ok
}

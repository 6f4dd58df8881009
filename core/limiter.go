package core

import (
	"context"
	"errors"
	"github.com/holdfast/holdfast/core/driver"
	"strings"
	"time"
)

// DefaultPrefix is the storage key prefix when Options.Prefix is empty.
const DefaultPrefix = "hf:"

// Options configures a Limiter. The zero value of each field means its
// documented default.
type Options struct {
	// Prefix starts every storage key. "" means DefaultPrefix. It may not
	// contain '{' or '}', which delimit the Redis Cluster hash tag.
	Prefix string
	// NewID returns a unique request id for algorithms that log each
	// request. nil means NewRequestID.
	NewID func() string
}

// A Limiter decides requests against policies, with its state in a Store.
// A Limiter is safe for concurrent use.
type Limiter struct {
	store  driver.Store
	prefix string
	newID  func() string
	mode   Mode
	direct driver.DirectStore // the store, when it decides without scripts
}

// NewLimiter returns a Limiter over store.
func NewLimiter(store driver.Store, opts Options) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("core: NewLimiter: nil store")
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, errorf(ErrInvalidPolicy, "key prefix %q contains a brace", prefix)
	}
	l := &Limiter{store: store, prefix: prefix, newID: opts.NewID, mode: ModeRedis}
	if l.newID == nil {
		l.newID = driver.NewRequestID
	}
	if driver.IsLocal(store) {
		l.mode = ModeLocal
	}
	l.direct, _ = store.(driver.DirectStore)
	return l, nil
}

// Allow is shorthand for AllowN(ctx, p, key, 1).
func (l *Limiter) Allow(ctx context.Context, p Policy, key string) (Result, error) {
	return l.AllowN(ctx, p, key, 1)
}

// AllowN reports whether cost units may be spent now by key under policy p,
// and spends them if so. Errors report bad input or a failing store; a
// denial is a Result.
func (l *Limiter) AllowN(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	if ctx == nil {
		return Result{}, ErrNilContext
	}
	if l.direct != nil {
		// RunDirect checks the request itself.
		if r, ok, err := l.direct.RunDirect(ctx, l.prefix, p, key, cost); ok {
			if err != nil {
				return Result{}, err
			}
			return l.result(p, r), nil
		}
	}
	if err := driver.CheckRequest(p, key, cost); err != nil {
		return Result{}, err
	}
	var id string
	if p.Algorithm().NeedsID() {
		id = l.newID()
	}
	r, err := l.run(ctx, p, key, cost, id)
	if err != nil {
		return Result{}, err
	}
	return l.result(p, r), nil
}

// run executes one decision step on the store and decodes its reply.
func (l *Limiter) run(ctx context.Context, p Policy, key string, cost int64, id string) (driver.Reply, error) {
	raw, err := l.store.Run(ctx, p.Algorithm().Script(), []string{l.Key(p, key)}, p.Algorithm().Args(p, cost, id, 0))
	if err != nil {
		return driver.Reply{}, err
	}
	return driver.ParseReply(raw)
}

// result turns a reply into a Result.
func (l *Limiter) result(p Policy, r driver.Reply) Result {
	return ResultOf(p.Limit(), r, l.mode, false)
}

// ResultOf is the Result of decision reply r against a limit of limit
// units, decided in mode (degraded when the shared store was not
// consulted): the one conversion every limiter, core's and fallback's,
// makes.
func ResultOf(limit int64, r driver.Reply, mode Mode, degraded bool) Result {
	return Result{
		Allowed:    r.Allowed,
		Limit:      limit,
		Remaining:  r.Remaining,
		RetryAfter: time.Duration(r.RetryAfter) * time.Microsecond,
		ResetAfter: time.Duration(r.ResetAfter) * time.Microsecond,
		Mode:       mode,
		Degraded:   degraded,
	}
}

// A Decider decides whether key may spend cost units of policy p now, as
// Limiter and fallback.Limiter do: what the HTTP middleware, the gRPC
// interceptors and the metrics wrapper take.
type Decider interface {
	AllowN(ctx context.Context, p Policy, key string, cost int64) (Result, error)
}

var _ Decider = (*Limiter)(nil)

// Key returns the storage key of client key under policy p:
// prefix + "{" + policy + ":" + key + "}". The braces are a Redis Cluster
// hash tag, so every key derived from it lives in one slot.
func (l *Limiter) Key(p Policy, key string) string {
	return driver.StorageKey(l.prefix, p.Name(), key)
}

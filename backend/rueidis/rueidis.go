// Package rueidis is a driver.Store on a rueidis Client: a single node or a
// Redis Cluster, with rueidis's automatic pipelining of concurrent calls.
// It is interchangeable with backend/goredis. Every storage key a script
// touches carries the same hash tag, so one script runs on one cluster node.
package rueidis

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// Store is a driver.Store that runs scripts with EVALSHA, falling back to EVAL
// when the server has lost its script cache. It never retries. It is safe for
// concurrent use.
//
// On a client from NewClient, a Run call made while at most LoneCalls are
// in flight on the Store (itself included) is written and read on the
// caller's goroutine, on a pooled connection of its own; a call made while
// more are in flight goes on an automatically pipelined connection, with
// them: one whose writer never waits for more calls while fewer than
// CrowdCalls are in flight, the one that waits MaxFlushDelay after each
// flush from then on. A lone caller, and the few calls in flight on a hot
// key whose decisions share calls (below), so wait for their round trip
// only, not for the hand-offs to and from a pipeline's writer and reader
// goroutines; a few callers are not held up
// by a flush delay, and many share the fewest writes and reads. On
// another client every call goes as that client sends it.
//
// Unless built with StoreOptions.NoCollapse, the decisions on one key that
// arrive while a call on that key is in flight wait for it, and then go
// together in one call of their script's Many (pipeline.Decisions): a hot
// key's callers share one round trip, one read and one write of the key.
type Store struct {
	c        rueidis.Client
	lone     rueidis.Client // nil unless c is NewClient's
	quick    rueidis.Client // nil unless c is NewClient's, with a MaxFlushDelay
	inflight atomic.Int64   // Run calls in flight
	dec      *pipeline.Decisions
}

var (
	_ driver.Store     = (*Store)(nil)
	_ driver.Pinger    = (*Store)(nil)
	_ driver.Pipeliner = (*Store)(nil)
)

// New returns a Store on c: a client from NewClient or the application's
// own (its pool shared with the rest of the service). Any rueidis client
// keeps a limiter's deadline: rueidis bounds every call by its context, and
// it never re-sends a script (holdfast's scripts are not made retryable, and
// rueidis retries only read-only or retryable commands). What NewClient adds
// is short dial and write timeouts, so that a dead Redis fails fast and a
// connection whose reply is late is dropped (ConnWriteTimeout), and the
// connections of lone calls (see Store).
func New(c rueidis.Client) *Store {
	return NewWithOptions(c, StoreOptions{})
}

// StoreOptions tunes a Store.
type StoreOptions struct {
	// NoCollapse sends every decision in a call of its own: without it,
	// the decisions on one key that arrive while a call on that key is in
	// flight go together in one call (driver.Many, pipeline.Decisions).
	NoCollapse bool
	// KeysDepth is how many decision calls may be in flight on the Store
	// before decisions on keys without a call in flight wait for one to
	// land and go together in one call of several keys (driver.Many's
	// Keys; pipeline.Decisions.Depth), once KeysFrom decisions are in the
	// Store. 0 means DefaultKeysDepth; a negative KeysDepth sends no call
	// of several keys.
	KeysDepth int
	// KeysFrom is how many decisions must be in the Store at once, in
	// flight or waiting, before any waits to share a call of several keys
	// (pipeline.Decisions.KeysFrom); 0 means pipeline.DefaultKeysFrom.
	KeysFrom int
}

// DefaultKeysDepth is StoreOptions.KeysDepth's default,
// pipeline.DefaultKeysDepth, as go-redis's.
const DefaultKeysDepth = pipeline.DefaultKeysDepth

// NewWithOptions is New with options o.
func NewWithOptions(c rueidis.Client, o StoreOptions) *Store {
	s := &Store{c: c}
	if cl, ok := c.(*client); ok {
		s.lone, s.quick = cl.lone, cl.quick
	}
	if !o.NoCollapse {
		s.dec = &pipeline.Decisions{One: s.run, Classify: classify, Cluster: c.Mode() == rueidis.ClientModeCluster, Depth: cmp.Or(o.KeysDepth, DefaultKeysDepth), KeysFrom: o.KeysFrom}
	}
	return s
}

// Run runs script sc on keys and args and returns its reply, which must be
// an array of integers. A call that fails after the script was sent (a
// deadline, a broken connection) has an unknown outcome: the script may have
// run, so its spend must be treated as possibly applied. A call abandoned
// at its deadline on the pipelined connection stays queued there and may
// still run when a stalled server wakes up. Run sends EVALSHA, and EVAL
// when the server answers NOSCRIPT (its script cache was flushed), as
// rueidis's Lua.Exec does.
func (s *Store) Run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	if ctx == nil {
		return nil, core.ErrNilContext
	}
	if s.dec != nil {
		return s.dec.Run(ctx, sc, keys, args)
	}
	return s.run(ctx, sc, keys, args)
}

// run is Run of one call, on its own: EVALSHA of sc, and EVAL when the
// server answers NOSCRIPT (its script cache was flushed), as rueidis's
// Lua.Exec does, on the client that suits the calls in flight (see
// Store).
func (s *Store) run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	c := s.c
	switch n := s.inflight.Add(1); {
	case n <= LoneCalls && s.lone != nil:
		c = s.lone
		if _, ok := ctx.Deadline(); !ok {
			// rueidis runs a call on the caller's goroutine only when
			// nothing but a deadline can end it: given a context that can
			// be cancelled but has no deadline, it hands the connection to
			// a writer and a reader goroutine for good. Such a call is
			// bounded by ConnWriteTimeout instead, as rueidis bounds a
			// call without a deadline on that path (which watches only
			// deadlines, never cancellation).
			if err := ctx.Err(); err != nil {
				s.inflight.Add(-1)
				return nil, classify(sc.Name(), err)
			}
			ctx = context.WithoutCancel(ctx)
		}
	case n < CrowdCalls && s.quick != nil:
		c = s.quick
	}
	defer s.inflight.Add(-1)
	res := s.do(ctx, c, c.B().Evalsha().Sha1(sc.SHA1()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = s.do(ctx, c, c.B().Eval().Script(sc.Source()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return parse(sc.Name(), res)
}

// LoneCalls is how many Run calls in flight on a Store go on pooled
// connections of their own, each written and read on its caller's
// goroutine (see Store): pipeline.DirectCalls, chosen with the benchmark
// harness.
const LoneCalls = pipeline.DirectCalls

// staleRetries bounds how many stale pooled connections a lone call
// passes over.
const staleRetries = 3

// do sends cmd on c. On the lone calls' client, a call refused with
// errStale was not sent (its pooled connection was found closed by the
// server before the write, and is dropped): it is sent again, on another.
func (s *Store) do(ctx context.Context, c rueidis.Client, cmd rueidis.Completed) rueidis.RedisResult {
	for attempt := 0; ; attempt++ {
		// rueidis recycles a command only once it has succeeded, so a
		// refused one can be sent again.
		res := c.Do(ctx, cmd)
		if c != s.lone || attempt == staleRetries || !errors.Is(res.Error(), errStale) {
			return res
		}
	}
}

// parse maps the result of running script name: its error, or its reply,
// which must be an array of integers.
func parse(name string, res rueidis.RedisResult) ([]int64, error) {
	if err := res.Error(); err != nil {
		return nil, classify(name, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return nil, driver.Errorf(core.ErrMalformedReply, "script %s: want an array of integers: %v", name, err)
	}
	out := make([]int64, len(arr))
	for i := range arr {
		// ToInt64 accepts only integer replies, as go-redis does; AsInt64
		// would also parse numeric strings.
		n, err := arr[i].ToInt64()
		if err != nil {
			return nil, driver.Errorf(core.ErrMalformedReply, "script %s: element %d: %v", name, i, err)
		}
		out[i] = n
	}
	return out, nil
}

// Ping reports whether the server answers PING, with the same error mapping
// as Run. It is the health probe of the fallback layer.
func (s *Store) Ping(ctx context.Context) error {
	if ctx == nil {
		return core.ErrNilContext
	}
	if err := s.c.Do(ctx, s.c.B().Ping().Build()).Error(); err != nil {
		return classify("PING", err)
	}
	return nil
}

// replyErrors maps rueidis errors onto core's errors.
var replyErrors = pipeline.Errors{
	Prefix: "rueidis",
	IsNil:  rueidis.IsRedisNil,
	Reply: func(err error) (string, bool) {
		rerr, ok := rueidis.IsRedisErr(err)
		if !ok {
			return "", false
		}
		return rerr.Error(), true
	},
}

// classify maps a rueidis error onto core's errors, keeping the cause. Any
// error that is not a Redis error reply (network, deadline, context, closed
// client) means the store is unavailable.
func classify(name string, err error) error { return replyErrors.Classify(name, err) }

// Package rueidis is a core.Store on a rueidis Client: a single node or a
// Redis Cluster, with rueidis's automatic pipelining of concurrent calls.
// It is interchangeable with backend/goredis. Every storage key a script
// touches carries the same hash tag, so one script runs on one cluster node.
package rueidis

import (
	"context"
	"sync"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// Store is a core.Store that runs scripts with EVALSHA, falling back to EVAL
// when the server has lost its script cache. It never retries. It is safe for
// concurrent use.
type Store struct {
	c       rueidis.Client
	scripts sync.Map // *core.Script -> *rueidis.Lua
}

var (
	_ core.Store     = (*Store)(nil)
	_ core.Pinger    = (*Store)(nil)
	_ core.Pipeliner = (*Store)(nil)
)

// New returns a Store on c: a client from NewClient or the application's
// own (its pool shared with the rest of the service). Any rueidis client
// keeps a limiter's deadline: rueidis bounds every call by its context, and
// it never re-sends a script (holdfast's scripts are not made retryable, and
// rueidis retries only read-only or retryable commands). What NewClient adds
// is short dial and write timeouts, so that a dead Redis fails fast and a
// connection whose reply is late is dropped (ConnWriteTimeout).
func New(c rueidis.Client) *Store {
	return &Store{c: c}
}

// Run runs script sc on keys and args and returns its reply, which must be
// an array of integers. A call that fails after the script was sent (a
// deadline, a broken connection) has an unknown outcome: the script may have
// run, so its spend must be treated as possibly applied. With automatic
// pipelining a call abandoned at its deadline stays queued on the connection
// and may still run when a stalled server wakes up.
func (s *Store) Run(ctx context.Context, sc *core.Script, keys, args []string) ([]int64, error) {
	if ctx == nil {
		return nil, core.ErrNilContext
	}
	return parse(sc.Name(), s.script(sc).Exec(ctx, s.c, keys, args))
}

// parse maps the result of running script name: its error, or its reply,
// which must be an array of integers.
func parse(name string, res rueidis.RedisResult) ([]int64, error) {
	if err := res.Error(); err != nil {
		return nil, classify(name, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return nil, core.Errorf(core.ErrMalformedReply, "script %s: want an array of integers: %v", name, err)
	}
	out := make([]int64, len(arr))
	for i := range arr {
		// ToInt64 accepts only integer replies, as go-redis does; AsInt64
		// would also parse numeric strings.
		n, err := arr[i].ToInt64()
		if err != nil {
			return nil, core.Errorf(core.ErrMalformedReply, "script %s: element %d: %v", name, i, err)
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

// script returns the rueidis script for sc, made once per *core.Script.
func (s *Store) script(sc *core.Script) *rueidis.Lua {
	if v, ok := s.scripts.Load(sc); ok {
		return v.(*rueidis.Lua)
	}
	v, _ := s.scripts.LoadOrStore(sc, rueidis.NewLuaScript(sc.Source()))
	return v.(*rueidis.Lua)
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

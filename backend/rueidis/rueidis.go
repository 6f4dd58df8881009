// Package rueidis is a core.Store on a rueidis Client: a single node or a
// Redis Cluster, with rueidis's automatic pipelining of concurrent calls.
// It is interchangeable with backend/goredis. Every storage key a script
// touches carries the same hash tag, so one script runs on one cluster node.
package rueidis

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/core"
)

// Store is a core.Store that runs scripts with EVALSHA, falling back to EVAL
// when the server has lost its script cache. It never retries. It is safe for
// concurrent use.
type Store struct {
	c       rueidis.Client
	scripts sync.Map // *core.Script -> *rueidis.Lua
}

var _ core.Store = (*Store)(nil)

// New returns a Store on c. For the deadlines core.Store callers rely on, build
// c with NewClient or with the same options.
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

// unavailablePrefixes are Redis error replies that mean the server cannot
// serve now (loading its data set, busy in a script, failing over), not that
// the request is wrong. rueidis strips a leading "ERR ".
var unavailablePrefixes = []string{
	"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY",
	"NOREPLICAS", "max number of clients reached",
}

// classify maps a rueidis error onto core's errors, keeping the cause. Any
// error that is not a Redis error reply (network, deadline, context, closed
// client) means the store is unavailable.
func classify(name string, err error) error {
	if rueidis.IsRedisNil(err) {
		return core.Errorf(core.ErrMalformedReply, "script %s: nil reply, want an array of integers", name)
	}
	rerr, ok := rueidis.IsRedisErr(err)
	if !ok {
		return fmt.Errorf("%w: %s: %w", core.ErrStoreUnavailable, name, err)
	}
	msg := rerr.Error()
	if strings.Contains(msg, "WRONGTYPE") {
		return fmt.Errorf("%w: %s: %w", core.ErrWrongType, name, err)
	}
	for _, p := range unavailablePrefixes {
		if strings.HasPrefix(msg, p) {
			return fmt.Errorf("%w: %s: %w", core.ErrStoreUnavailable, name, err)
		}
	}
	return fmt.Errorf("rueidis: %s: %w", name, err)
}

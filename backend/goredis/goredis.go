// Package goredis is a core.Store on a go-redis v9 UniversalClient: a single
// node, a Redis Cluster or a Sentinel-managed primary. Every storage key a
// script touches carries the same hash tag, so one script runs on one
// cluster node.
package goredis

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// Store is a core.Store that runs scripts with EVALSHA, falling back to EVAL
// when the server has lost its script cache. It never retries. It is safe for
// concurrent use.
type Store struct {
	c       redis.UniversalClient
	scripts sync.Map // *core.Script -> *redis.Script
}

var (
	_ core.Store     = (*Store)(nil)
	_ core.Pinger    = (*Store)(nil)
	_ core.Pipeliner = (*Store)(nil)
)

// New returns a Store on c. For the deadlines core.Store callers rely on, build
// c with NewClient or with the same options.
func New(c redis.UniversalClient) *Store {
	return &Store{c: c}
}

// Run runs script sc on keys and args and returns its reply, which must be
// an array of integers. A call that fails after the script was sent (a
// timeout, a broken connection) has an unknown outcome: the script may have
// run, so its spend must be treated as possibly applied.
func (s *Store) Run(ctx context.Context, sc *core.Script, keys, args []string) ([]int64, error) {
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	v, err := s.script(sc).Run(ctx, s.c, keys, argv...).Result()
	if err != nil {
		return nil, classify(sc.Name(), err)
	}
	return parse(sc.Name(), v)
}

// Ping reports whether the server answers PING, with the same error mapping
// as Run. It is the health probe of the fallback layer.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.c.Ping(ctx).Err(); err != nil {
		return classify("PING", err)
	}
	return nil
}

// script returns the go-redis script for sc, made once per *core.Script.
func (s *Store) script(sc *core.Script) *redis.Script {
	if v, ok := s.scripts.Load(sc); ok {
		return v.(*redis.Script)
	}
	v, _ := s.scripts.LoadOrStore(sc, redis.NewScript(sc.Source()))
	return v.(*redis.Script)
}

// parse checks that v is an array of integers.
func parse(name string, v any) ([]int64, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, core.Errorf(core.ErrMalformedReply, "script %s: reply is %T, want an array of integers", name, v)
	}
	out := make([]int64, len(arr))
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			return nil, core.Errorf(core.ErrMalformedReply, "script %s: element %d is %T, want an integer", name, i, e)
		}
		out[i] = n
	}
	return out, nil
}

// replyErrors maps go-redis errors onto core's errors.
var replyErrors = pipeline.Errors{
	Prefix: "goredis",
	IsNil:  func(err error) bool { return errors.Is(err, redis.Nil) },
	Reply: func(err error) (string, bool) {
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			return "", false
		}
		return rerr.Error(), true
	},
	Unavailable: []string{
		"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY",
		"NOREPLICAS", "ERR max number of clients reached",
	},
}

// classify maps a go-redis error onto core's errors, keeping the cause. Any
// error that is not a Redis error reply (network, timeout, context, pool,
// closed client) means the store is unavailable.
func classify(name string, err error) error { return replyErrors.Classify(name, err) }

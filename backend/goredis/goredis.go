// Package goredis is a driver.Store on a go-redis v9 UniversalClient: a single
// node, a Redis Cluster or a Sentinel-managed primary. Every storage key a
// script touches carries the same hash tag, so one script runs on one
// cluster node. Run calls that arrive while others are in flight share
// pipelines, as rueidis's calls do (see StoreOptions).
package goredis

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// Store is a driver.Store that runs scripts with EVALSHA, falling back to EVAL
// when the server has lost its script cache. It never retries. It is safe for
// concurrent use. Unless built with StoreOptions.NoCoalesce, it sends Run
// calls that arrive while another is in flight together in pipelines (see
// StoreOptions). Unless built with StoreOptions.NoCollapse, the decisions on
// one key that arrive while a call on that key is in flight wait for it,
// and then go together in one call (pipeline.Decisions).
type Store struct {
	c       redis.UniversalClient
	scripts sync.Map            // *driver.Script -> *script
	co      *coalescer          // nil with NoCoalesce
	dec     *pipeline.Decisions // nil with NoCollapse
}

var (
	_ driver.Store     = (*Store)(nil)
	_ driver.Pinger    = (*Store)(nil)
	_ driver.Pipeliner = (*Store)(nil)
)

// New returns a Store on c that coalesces concurrent Run calls with the
// default StoreOptions. For the deadlines driver.Store callers rely on, build c
// with NewClient, or pass the application's own client to FromClient, which
// checks its options.
func New(c redis.UniversalClient) *Store {
	return NewWithOptions(c, StoreOptions{})
}

// DefaultKeysDepth is StoreOptions.KeysDepth's default,
// pipeline.DefaultKeysDepth, as rueidis's.
const DefaultKeysDepth = pipeline.DefaultKeysDepth

// NewWithOptions returns a Store on c with options o. For the deadlines
// driver.Store callers rely on, build c with NewClient or with the same
// options.
func NewWithOptions(c redis.UniversalClient, o StoreOptions) *Store {
	s := &Store{c: c}
	if !o.NoCoalesce {
		s.co = newCoalescer(o)
	}
	if !o.NoCollapse {
		s.dec = &pipeline.Decisions{One: s.run, Classify: classify, Depth: cmp.Or(o.KeysDepth, DefaultKeysDepth), KeysFrom: o.KeysFrom}
		switch c.(type) {
		case *redis.Client:
		case *redis.ClusterClient:
			s.dec.Cluster = true
		default:
			// A Ring shards by key on the client: a call of several
			// keys would run on the first key's shard.
			s.dec.Depth = -1
		}
	}
	return s
}

// Run runs script sc on keys and args and returns its reply, which must be
// an array of integers. A call that fails after the script was sent (a
// timeout, a broken connection) has an unknown outcome: the script may have
// run, so its spend must be treated as possibly applied. A call whose
// context ends while it waits in a coalesced pipeline is such a call too.
// Run does not keep keys or args after it returns.
//
// A call sent on its own sends EVALSHA, and EVAL once when the server
// answers NOSCRIPT (its script cache was flushed, or it restarted), as
// redis.Script.Run does, but with one argument slice built once: this is
// the path of every decision of a lone caller. A coalesced call goes in a
// pipeline through RunMany, and is sent on its own as above if the server
// still refuses it with NOSCRIPT there (its cache was flushed again).
func (s *Store) Run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	if ctx == nil {
		return nil, core.ErrNilContext
	}
	if s.dec != nil {
		return s.dec.Run(ctx, sc, keys, args)
	}
	return s.run(ctx, sc, keys, args)
}

// run is Run of one call: coalesced, or on its own.
func (s *Store) run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	if s.co != nil {
		return s.runCoalesced(ctx, sc, keys, args)
	}
	return s.runDirect(ctx, sc, keys, args)
}

// runDirect is Run on a connection of its own: EVALSHA, then EVAL on
// NOSCRIPT.
func (s *Store) runDirect(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	sh := s.script(sc)
	argv := make([]any, 3+len(keys)+len(args))
	argv[0], argv[1], argv[2] = "evalsha", sh.sha, len(keys)
	for i, k := range keys {
		argv[3+i] = k
	}
	for i, a := range args {
		argv[3+len(keys)+i] = a
	}
	v, err := s.do(ctx, argv, len(keys))
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Not run: send the source.
		argv[0], argv[1] = "eval", sh.src
		v, err = s.do(ctx, argv, len(keys))
	}
	if err != nil {
		return nil, classify(sc.Name(), err)
	}
	return parse(sc.Name(), v)
}

// do sends one EVAL or EVALSHA command, argv, with numKeys keys.
func (s *Store) do(ctx context.Context, argv []any, numKeys int) (any, error) {
	cmd := redis.NewCmd(ctx, argv...)
	if numKeys > 0 {
		cmd.SetFirstKeyPos(3) // routes a cluster call by the first key
	}
	_ = s.c.Process(ctx, cmd)
	return cmd.Result()
}

// Ping reports whether the server answers PING, with the same error mapping
// as Run. It is the health probe of the fallback layer.
func (s *Store) Ping(ctx context.Context) error {
	if ctx == nil {
		return core.ErrNilContext
	}
	if err := s.c.Ping(ctx).Err(); err != nil {
		return classify("PING", err)
	}
	return nil
}

// script is what the store keeps per *driver.Script: the go-redis script
// (for SCRIPT LOAD) and the SHA1 and source already boxed as command
// arguments, so that a call does not allocate them again.
type script struct {
	rs       *redis.Script
	sha, src any
}

// script returns the entry for sc, made once per *driver.Script.
func (s *Store) script(sc *driver.Script) *script {
	if v, ok := s.scripts.Load(sc); ok {
		return v.(*script)
	}
	v, _ := s.scripts.LoadOrStore(sc, &script{rs: redis.NewScript(sc.Source()), sha: sc.SHA1(), src: sc.Source()})
	return v.(*script)
}

// parse checks that v is an array of integers.
func parse(name string, v any) ([]int64, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, driver.Errorf(core.ErrMalformedReply, "script %s: reply is %T, want an array of integers", name, v)
	}
	out := make([]int64, len(arr))
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			return nil, driver.Errorf(core.ErrMalformedReply, "script %s: element %d is %T, want an integer", name, i, e)
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
}

// classify maps a go-redis error onto core's errors, keeping the cause. Any
// error that is not a Redis error reply (network, timeout, context, pool,
// closed client) means the store is unavailable.
func classify(name string, err error) error { return replyErrors.Classify(name, err) }

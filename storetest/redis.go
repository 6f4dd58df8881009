package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// A RedisStore is a store of a Redis backend: it also pings and pipelines.
type RedisStore interface {
	driver.Store
	driver.Pinger
	driver.Pipeliner
	driver.Commander
}

// A RedisHarness makes the stores of a Redis backend for RunRedis and the
// Redis benchmarks, which start their own servers.
type RedisHarness interface {
	// NewStore returns a store on a new client for the Redis server at url,
	// with client settings for o. The client is closed when t ends. It
	// fails t if the client cannot be made.
	NewStore(t testing.TB, url string, o StoreOptions) RedisStore
	// IsReplyError reports whether err keeps the client's own error for a
	// Redis error reply (redis.Error, *rueidis.RedisError).
	IsReplyError(err error) bool
	// SetPipelineSizing sets RunMany's chunk size and the number of chunks
	// in flight, and returns a func that restores the previous values. The
	// benchmarks, which run alone, use it.
	SetPipelineSizing(chunk, workers int) (restore func())
}

// StoreOptions are the client settings a Redis suite asks a RedisHarness
// for, in terms each backend maps onto its own client options. The zero
// value asks for the backend's default client options: the short deadlines a
// limiter runs with.
type StoreOptions struct {
	// Relaxed asks for deadlines of seconds, for tests that are not about
	// deadlines: a busy machine running -race must not turn a slow reply
	// into a failure.
	Relaxed bool
	// StallTimeout, if positive, bounds how long a call without a context
	// deadline waits on a server that has stopped answering before it
	// fails; a harness may choose a shorter wait. 0 means the client's
	// default.
	StallTimeout time.Duration
	// KeysDepth, if not 0, is the store's depth of calls in flight past
	// which decisions on distinct keys share calls (the backends'
	// StoreOptions.KeysDepth); 0 means the backend's default.
	KeysDepth int
	// KeysFrom, if not 0, is how many decisions must be in the store
	// before any waits to share a call of several keys (the backends'
	// StoreOptions.KeysFrom); 0 means the backend's default.
	KeysFrom int
}

// relaxed are the options of tests that are not about deadlines.
var relaxed = StoreOptions{Relaxed: true}

// StallBound is the longest a call with a 50 ms deadline may take against a
// dead or black-holed Redis. It is a correctness bound on a stall, far above
// the deadline so that a loaded machine does not fail it.
const StallBound = 500 * time.Millisecond

// onServer starts a redis-server for t and returns a Harness whose stores
// are h's stores on it, each on its own client with relaxed deadlines.
func onServer(t testing.TB, h RedisHarness) Harness {
	return serverHarness{h, redistest.Start(t).URL()}
}

type serverHarness struct {
	h   RedisHarness
	url string
}

func (s serverHarness) MakeStore(t *testing.T) driver.Store { return s.h.NewStore(t, s.url, relaxed) }

var (
	scriptInts    = driver.NewScript("ints", "return {1, tonumber(ARGV[1]), #KEYS, -4}", nil)
	scriptEmpty   = driver.NewScript("empty", "return {}", nil)
	scriptString  = driver.NewScript("string", "return 'hello'", nil)
	scriptNested  = driver.NewScript("nested", "return {1, {2, 3}}", nil)
	scriptStrElem = driver.NewScript("strelem", "return {1, 'x'}", nil)
	scriptNumStr  = driver.NewScript("numstr", "return {1, '2'}", nil)
	scriptNil     = driver.NewScript("nil", "return nil", nil)
	scriptHSet    = driver.NewScript("hset", "return {redis.call('HSET', KEYS[1], 'f', 'v')}", nil)
	scriptFail    = driver.NewScript("fail", "return redis.error_reply('boom')", nil)
)

// RunRedis runs the suite of a Redis backend on servers of its own. First,
// each alone, come RunDistributed, whose 95% lower bound on admitted
// requests needs the CPU that the other tests' servers would take, and the
// faults (runFaults), whose bounds on how long a failing call takes must not
// depend on the load of the other tests. Then, in parallel, come the
// conformance suite (Run), RunDifferential, and the tests of Run, Ping and
// RunMany. Call RunRedis from a test that is not parallel.
func RunRedis(t *testing.T, h RedisHarness) {
	t.Run("distributed", func(t *testing.T) {
		RunDistributed(t, onServer(t, h), 4, 3*time.Second)
	})
	t.Run("faults", func(t *testing.T) { runFaults(t, h) })
	runParallel(t, h, []redisTest{
		{"conformance", func(t *testing.T, h RedisHarness) { Run(t, onServer(t, h)) }},
		{"differential", func(t *testing.T, h RedisHarness) { RunDifferential(t, onServer(t, h)) }},
		{"replies", testReplies},
		{"script_error_is_not_unavailable", testScriptError},
		{"error_classes", testErrorClasses},
		{"deadline_guard", testDeadlineGuard},
		{"collapse", testCollapse},
		{"collapse_give_up", testCollapseGiveUp},
		{"keys", testKeys},
		{"script_flush", testScriptFlush},
		{"password", testPassword},
		{"pipeline", func(t *testing.T, h RedisHarness) { runParallel(t, h, pipelineTests) }},
		{"commands", func(t *testing.T, h RedisHarness) { runParallel(t, h, commandTests) }},
	})
}

// A redisTest is one test of the Redis suite.
type redisTest struct {
	name string
	test func(*testing.T, RedisHarness)
}

// runParallel runs each test as a parallel subtest of t.
func runParallel(t *testing.T, h RedisHarness, tests []redisTest) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, h)
		})
	}
}

func testReplies(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	srv.Do(t, "RPUSH", "{t}:list", "x")
	for _, tc := range []struct {
		sc      *driver.Script
		keys    []string
		want    []int64
		wantErr error
	}{
		{scriptInts, []string{"{t}:a", "{t}:b"}, []int64{1, 42, 2, -4}, nil},
		{scriptEmpty, nil, []int64{}, nil},
		{scriptString, nil, nil, core.ErrMalformedReply},
		{scriptNested, nil, nil, core.ErrMalformedReply},
		{scriptStrElem, nil, nil, core.ErrMalformedReply},
		{scriptNumStr, nil, nil, core.ErrMalformedReply}, // a numeric string is not an integer
		{scriptNil, nil, nil, core.ErrMalformedReply},
		{scriptHSet, []string{"{t}:list"}, nil, core.ErrWrongType},
		{scriptHSet, []string{"{t}:hash"}, []int64{1}, nil},
	} {
		got, err := s.Run(context.Background(), tc.sc, tc.keys, []string{"42"})
		if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
			t.Errorf("%s: error %v, want %v", tc.sc.Name(), err, tc.wantErr)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.sc.Name(), got, tc.want)
		}
		if err != nil {
			t.Logf("%s: %v", tc.sc.Name(), err)
		}
	}
}

func testScriptError(t *testing.T, h RedisHarness) {
	s := h.NewStore(t, redistest.Start(t).URL(), relaxed)
	_, err := s.Run(context.Background(), scriptFail, nil, nil)
	if err == nil || errors.Is(err, core.ErrStoreUnavailable) || errors.Is(err, core.ErrMalformedReply) {
		t.Fatalf("error_reply: got %v, want a plain error", err)
	}
	if !h.IsReplyError(err) {
		t.Fatalf("error_reply: %v does not keep the Redis error", err)
	}
}

func testScriptFlush(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	mustRun(t, s)
	srv.Do(t, "SCRIPT", "FLUSH")
	mustRun(t, s) // NOSCRIPT is handled by falling back to EVAL
	if got := srv.Do(t, "SCRIPT", "EXISTS", scriptInts.SHA1()); got != "[1]" {
		t.Fatalf("SCRIPT EXISTS after EVAL = %s, want [1]", got)
	}
}

func mustRun(t *testing.T, s driver.Store) {
	t.Helper()
	got, err := s.Run(context.Background(), scriptInts, []string{"k"}, []string{"7"})
	if err != nil || !reflect.DeepEqual(got, []int64{1, 7, 1, -4}) {
		t.Fatalf("Run = %v, %v", got, err)
	}
}

func testPassword(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t, redistest.WithPassword("s3cret"))
	mustRun(t, h.NewStore(t, srv.URL(), relaxed))
	s := h.NewStore(t, "redis://:wrong@"+srv.Addr(), relaxed)
	if _, err := s.Run(context.Background(), scriptInts, nil, []string{"1"}); err == nil || errors.Is(err, core.ErrMalformedReply) {
		t.Fatalf("wrong password: %v, want an error", err)
	} else {
		t.Logf("wrong password: %v", err)
	}
}

var (
	scriptReplyErr = driver.NewScript("reply_error", "return redis.error_reply(ARGV[1])", nil)
	scriptWrite    = driver.NewScript("write", "redis.call('SET', KEYS[1], ARGV[1]); return {1}", nil)
	scriptGuarded  = driver.NewDecisionScript("guarded", "redis.call('INCR', KEYS[1]); return {#ARGV, tonumber(ARGV[1])}", nil)
)

// testErrorClasses: each error reply of the table in docs/errors.md, as the
// client really delivers it, gets its class and reason; so do real OOM and
// NOPERM refusals of a script's write.
func testErrorClasses(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	ctx := context.Background()
	for _, tc := range []struct {
		msg    string
		class  core.ErrorClass
		reason string
	}{
		{"WRONGTYPE Operation against a key holding the wrong kind of value", core.ClassRequest, "WRONGTYPE"},
		{"OOM command not allowed when used memory > 'maxmemory'.", core.ClassUnavailable, "OOM"},
		{"READONLY You can't write against a read only replica.", core.ClassUnavailable, "READONLY"},
		{"LOADING Redis is loading the dataset in memory", core.ClassUnavailable, "LOADING"},
		{"BUSY Redis is busy running a script.", core.ClassUnavailable, "BUSY"},
		{"MASTERDOWN Link with MASTER is down", core.ClassUnavailable, "MASTERDOWN"},
		{"CLUSTERDOWN The cluster is down", core.ClassUnavailable, "CLUSTERDOWN"},
		{"TRYAGAIN Multiple keys request during rehashing of slot", core.ClassUnavailable, "TRYAGAIN"},
		{"MISCONF Redis is configured to save RDB snapshots", core.ClassUnavailable, "MISCONF"},
		{"NOPERM this user has no permissions to run the 'evalsha' command", core.ClassUnavailable, "NOPERM"},
		{"NOAUTH Authentication required.", core.ClassUnavailable, "NOAUTH"},
		{"WRONGPASS invalid username-password pair or user is disabled.", core.ClassUnavailable, "WRONGPASS"},
		{"ERR max number of clients reached", core.ClassUnavailable, "MAXCLIENTS"},
		{"STALE holdfast: the call ran after its deadline", core.ClassUnavailable, "STALE"},
		{"ERR something no table knows", core.ClassUnknown, "unknown"},
	} {
		_, err := s.Run(ctx, scriptReplyErr, nil, []string{tc.msg})
		if core.ClassOf(err) != tc.class || core.ReasonOf(err) != tc.reason {
			t.Errorf("%q: %v: class %v reason %q, want %v %q", tc.msg, err, core.ClassOf(err), core.ReasonOf(err), tc.class, tc.reason)
		}
		if !h.IsReplyError(err) {
			t.Errorf("%q: %v does not keep the Redis error", tc.msg, err)
		}
	}
	refusal := func(what, reason string) {
		t.Helper()
		_, err := s.Run(ctx, scriptWrite, []string{"{t}:w"}, []string{"1"})
		if core.ClassOf(err) != core.ClassUnavailable || core.ReasonOf(err) != reason {
			t.Errorf("%s: %v: class %v reason %q, want unavailable %q", what, err, core.ClassOf(err), core.ReasonOf(err), reason)
		}
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	refusal("maxmemory 1, noeviction", "OOM")
	srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	srv.Do(t, "ACL", "SETUSER", "default", "-evalsha", "-eval")
	refusal("ACL without EVALSHA and EVAL", "NOPERM")
	srv.Do(t, "ACL", "SETUSER", "default", "+@all")
	if _, err := s.Run(ctx, scriptWrite, []string{"{t}:w"}, []string{"1"}); err != nil {
		t.Fatalf("after the faults: %v", err)
	}
}

// testDeadlineGuard: a decision script refuses, with STALE and without
// writing, a call whose deadline (in Redis time) has passed; with a later
// deadline it runs with the deadline argument removed, and without one it
// runs as it is.
func testDeadlineGuard(t *testing.T, h RedisHarness) {
	srv := redistest.Start(t)
	s := h.NewStore(t, srv.URL(), relaxed)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	_, err := s.Run(ctx, scriptGuarded, []string{"{t}:g"}, []string{"7", driver.DeadlineArg(now - 1_000_000)})
	if core.ClassOf(err) != core.ClassUnavailable || core.ReasonOf(err) != "STALE" {
		t.Fatalf("past deadline: %v, want a STALE refusal", err)
	}
	if got := srv.Do(t, "GET", "{t}:g"); got != "" {
		t.Fatalf("a refused call wrote %q", got)
	}
	for _, args := range [][]string{{"7", driver.DeadlineArg(now + 60_000_000)}, {"7"}} {
		got, err := s.Run(ctx, scriptGuarded, []string{"{t}:g"}, args)
		if err != nil || !reflect.DeepEqual(got, []int64{1, 7}) {
			t.Fatalf("args %q: %v %v, want [1 7]: one argument left", args, got, err)
		}
	}
	if got := srv.Do(t, "GET", "{t}:g"); got != "2" {
		t.Fatalf("after two calls in time the key holds %q, want 2", got)
	}
}

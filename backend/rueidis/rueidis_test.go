package rueidis_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/redis/rueidis"

	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
)

// relaxed are client options for tests that are not about deadlines: a busy
// CI machine running -race must not turn a slow reply into a failure.
var relaxed = hfrueidis.ClientOptions{DialTimeout: 5 * time.Second, ConnWriteTimeout: 5 * time.Second, KeepAlive: time.Second}

// newStore returns a Store on url, closed when the test ends.
func newStore(t testing.TB, url string, o hfrueidis.ClientOptions) *hfrueidis.Store {
	t.Helper()
	c, err := hfrueidis.NewClient(url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return hfrueidis.New(c)
}

var (
	scriptInts    = core.NewScript("ints", "return {1, tonumber(ARGV[1]), #KEYS, -4}", nil)
	scriptEmpty   = core.NewScript("empty", "return {}", nil)
	scriptString  = core.NewScript("string", "return 'hello'", nil)
	scriptNested  = core.NewScript("nested", "return {1, {2, 3}}", nil)
	scriptStrElem = core.NewScript("strelem", "return {1, '2'}", nil)
	scriptNil     = core.NewScript("nil", "return nil", nil)
	scriptHSet    = core.NewScript("hset", "return {redis.call('HSET', KEYS[1], 'f', 'v')}", nil)
	scriptFail    = core.NewScript("fail", "return redis.error_reply('boom')", nil)
)

func TestRunReplies(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, srv.URL(), relaxed)
	srv.Do(t, "RPUSH", "{t}:list", "x")
	for _, tc := range []struct {
		sc      *core.Script
		keys    []string
		want    []int64
		wantErr error
	}{
		{scriptInts, []string{"{t}:a", "{t}:b"}, []int64{1, 42, 2, -4}, nil},
		{scriptEmpty, nil, []int64{}, nil},
		{scriptString, nil, nil, core.ErrMalformedReply},
		{scriptNested, nil, nil, core.ErrMalformedReply},
		{scriptStrElem, nil, nil, core.ErrMalformedReply}, // a numeric string is not an integer
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

func TestScriptErrorIsNotUnavailable(t *testing.T) {
	t.Parallel()
	s := newStore(t, redistest.Start(t).URL(), relaxed)
	_, err := s.Run(context.Background(), scriptFail, nil, nil)
	if err == nil || errors.Is(err, core.ErrStoreUnavailable) || errors.Is(err, core.ErrMalformedReply) {
		t.Fatalf("error_reply: got %v, want a plain error", err)
	}
	var rerr *rueidis.RedisError
	if !errors.As(err, &rerr) {
		t.Fatalf("error_reply: %v does not keep the Redis error", err)
	}
}

func TestScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, srv.URL(), relaxed)
	mustRun(t, s)
	srv.Do(t, "SCRIPT", "FLUSH")
	mustRun(t, s) // NOSCRIPT is handled by falling back to EVAL
	if got := srv.Do(t, "SCRIPT", "EXISTS", scriptInts.SHA1()); got != "[1]" {
		t.Fatalf("SCRIPT EXISTS after EVAL = %s, want [1]", got)
	}
}

func mustRun(t *testing.T, s *hfrueidis.Store) {
	t.Helper()
	got, err := s.Run(context.Background(), scriptInts, []string{"k"}, []string{"7"})
	if err != nil || !reflect.DeepEqual(got, []int64{1, 7, 1, -4}) {
		t.Fatalf("Run = %v, %v", got, err)
	}
}

func TestPassword(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithPassword("s3cret"))
	mustRun(t, newStore(t, srv.URL(), relaxed))
	s := newStore(t, "redis://:wrong@"+srv.Addr(), relaxed)
	if _, err := s.Run(context.Background(), scriptInts, nil, []string{"1"}); err == nil || errors.Is(err, core.ErrMalformedReply) {
		t.Fatalf("wrong password: %v, want an error", err)
	} else {
		t.Logf("wrong password: %v", err)
	}
}

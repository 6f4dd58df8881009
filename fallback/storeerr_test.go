package fallback_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// failing is a store whose decision calls fail with err while it is set;
// the membership heartbeat (the probe) fails with it too, so the breaker
// cannot close until it is cleared.
type failing struct {
	driver.Store
	err atomic.Pointer[error]
	// only, if set, limits the failures to scripts whose name starts with it.
	only   atomic.Pointer[string]
	failed atomic.Int64
}

func (f *failing) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	only := ""
	if o := f.only.Load(); o != nil {
		only = *o
	}
	if e := f.err.Load(); e != nil && strings.HasPrefix(s.Name(), only) {
		f.failed.Add(1)
		return nil, *e
	}
	return f.Store.Run(ctx, s, keys, args)
}

func (f *failing) set(err error) { f.err.Store(&err) }
func (f *failing) heal()         { f.err.Store(nil) }

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStoreErrorClasses: every store error but a wrong request is an
// outage: no error reaches the caller, the request is decided from the
// lease (admitted exactly up to the bucket's remaining tokens), and the
// breaker opens — at once for a refusal Redis answered, after Failures
// calls for a failure without an answer or one holdfast does not know
// (which is logged with its text). Status names the class and reason.
// Once the store serves again the breaker closes and the usage is
// replayed: Redis then has no token left to give.
func TestStoreErrorClasses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		err    error
		calls  int // failed calls that open the breaker
		class  string
		reason string
	}{
		{"OOM", &core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed when used memory > 'maxmemory'")}, 1, "unavailable", "OOM"},
		{"NOPERM", &core.StoreError{Class: core.ClassUnavailable, Reason: "NOPERM", Answered: true, Err: errors.New("NOPERM this user has no permissions to run the 'evalsha' command")}, 1, "unavailable", "NOPERM"},
		{"deadline", &core.StoreError{Class: core.ClassUnavailable, Reason: "deadline", Err: context.DeadlineExceeded}, 3, "unavailable", "deadline"},
		{"STALE", &core.StoreError{Class: core.ClassUnavailable, Reason: "STALE", Answered: true, Err: errors.New("STALE holdfast: the call ran after its deadline")}, 3, "unavailable", "STALE"},
		{"unknown", &core.StoreError{Class: core.ClassUnknown, Reason: "unknown", Answered: true, Err: errors.New("ERR weird reply 1234")}, 3, "unknown", "unknown"},
		{"malformed", driver.Errorf(core.ErrMalformedReply, "reply is a string"), 3, "unknown", "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			store := &failing{Store: newStore(t, "goredis", srv.URL())}
			l, err := fallback.New(store, fallback.Options{
				ID: "e-" + tc.name, Prefix: "hf:" + tc.name + ":", Heartbeat: time.Hour,
				Breaker: fallback.BreakerOptions{CallTimeout: callTimeout, ProbeInterval: 20 * time.Millisecond, Jitter: time.Nanosecond},
				Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			p, _ := tokenbucket.Policy("tb", 10, 0.001) // no refill within the test
			ctx := context.Background()
			for i := range 4 {
				if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Allowed || r.Degraded {
					t.Fatalf("healthy request %d: %+v %v", i, r, err)
				}
			}
			store.set(tc.err)
			admitted := 0
			for i := range 12 {
				r, err := l.Allow(ctx, p, "k")
				if err != nil {
					t.Fatalf("request %d in the fault: error %v reached the caller", i, err)
				}
				if !r.Degraded {
					t.Fatalf("request %d in the fault: %+v, want a local decision", i, r)
				}
				if r.Allowed {
					admitted++
				}
				if want := i+1 >= tc.calls; (l.Breaker().State() == fallback.Open) != want {
					t.Fatalf("after %d failed calls the breaker is %v", i+1, l.Breaker().State())
				}
			}
			if admitted != 6 {
				t.Fatalf("admitted %d in the fault, want the 6 tokens Redis left", admitted)
			}
			st := l.Status()
			if st.LastError == nil || st.LastError.Class != tc.class || st.LastError.Reason != tc.reason {
				t.Fatalf("status last error %+v, want %s/%s", st.LastError, tc.class, tc.reason)
			}
			if !strings.Contains(l.Breaker().Cause().Error(), tc.reason) && tc.reason != "malformed" {
				t.Fatalf("breaker cause %v does not name %s", l.Breaker().Cause(), tc.reason)
			}
			if want := "to=open class=" + tc.class + " reason=" + tc.reason; !strings.Contains(logs.String(), want) {
				t.Fatalf("the breaker's log line lacks %q: %s", want, logs.String())
			}
			if tc.class == "unknown" && !strings.Contains(logs.String(), "not recognised") {
				t.Fatalf("an unrecognised error was not logged: %s", logs.String())
			}
			time.Sleep(100 * time.Millisecond)
			if s := l.Breaker().State(); s != fallback.Open {
				t.Fatalf("breaker %v while the store still fails: the probe must not pass", s)
			}
			store.heal()
			deadline := time.Now().Add(5 * time.Second)
			for l.Breaker().State() != fallback.Closed || l.Status().PendingLog > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("not recovered: %+v", l.Status())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if r, err := l.Allow(ctx, p, "k"); err != nil || r.Allowed || r.Degraded {
				t.Fatalf("after recovery: %+v %v, want a Redis denial: the lease's 6 grants were replayed", r, err)
			}
		})
	}
}

// TestWrongTypeGoesToCaller: a key that holds another type is the
// request's problem: the caller gets ErrWrongType and the breaker stays
// closed.
func TestWrongTypeGoesToCaller(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, err := fallback.New(newStore(t, "goredis", srv.URL()), fallback.Options{ID: "wt", Logger: testLogger(),
		Breaker: fallback.BreakerOptions{CallTimeout: callTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, _ := tokenbucket.Policy("tb", 10, 1)
	srv.Do(t, "RPUSH", driver.StorageKey(core.DefaultPrefix, "tb", "k"), "x")
	for i := range 5 {
		if _, err := l.Allow(context.Background(), p, "k"); !errors.Is(err, core.ErrWrongType) {
			t.Fatalf("request %d: %v, want ErrWrongType", i, err)
		}
	}
	if s := l.Breaker().State(); s != fallback.Closed {
		t.Fatalf("breaker %v after WRONGTYPE replies, want closed", s)
	}
}

// TestServicesCountOwnInstances: two services on one Redis and prefix each
// count only their own instances, and an instance that closes leaves its
// service's set.
func TestServicesCountOwnInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	start := func(service, id string) *fallback.Limiter {
		l, err := fallback.New(newStore(t, "goredis", srv.URL()), fallback.Options{ID: id, Service: service,
			Heartbeat: 50 * time.Millisecond, Logger: testLogger(), Breaker: fallback.BreakerOptions{CallTimeout: callTimeout}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	a := []*fallback.Limiter{start("api", "a1"), start("api", "a2"), start("api", "a3")}
	b := []*fallback.Limiter{start("billing", "b1"), start("billing", "b2")}
	defer func() {
		for _, l := range append(a, b...) {
			l.Close()
		}
	}()
	wait := func(l *fallback.Limiter, want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for l.Status().Instances != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s counts %d instances, want %d", l.Status().ID, l.Status().Instances, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, l := range a {
		wait(l, 3)
	}
	for _, l := range b {
		wait(l, 2)
	}
	if got := srv.Do(t, "ZCARD", core.DefaultPrefix+"{members}:api"); got != "3" {
		t.Fatalf("api's set holds %s members, want 3", got)
	}
	a[2].Close()
	if got := srv.Do(t, "ZCARD", core.DefaultPrefix+"{members}:api"); got != "2" {
		t.Fatalf("after Close api's set holds %s members, want 2: Close leaves the set", got)
	}
}

// TestReplayRefusedGoesBackToOpen: a probe that passes while the replay is
// refused (OOM) sends the breaker from reconciling back to open, with every
// grant kept in the log; once the replay is taken the breaker closes and
// Redis counts each grant once.
func TestReplayRefusedGoesBackToOpen(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := &failing{Store: newStore(t, "goredis", srv.URL())}
	var mu sync.Mutex
	var seen []fallback.State
	l, err := fallback.New(store, fallback.Options{
		ID: "replay", Heartbeat: time.Hour, Logger: testLogger(),
		Breaker: fallback.BreakerOptions{CallTimeout: callTimeout, ProbeInterval: 20 * time.Millisecond, Jitter: time.Nanosecond,
			OnStateChange: func(_, to fallback.State) { mu.Lock(); seen = append(seen, to); mu.Unlock() }},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, _ := tokenbucket.Policy("tb", 10, 0.001)
	ctx := context.Background()
	for range 4 {
		l.Allow(ctx, p, "k")
	}
	store.set(&core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed")})
	for range 6 {
		if r, err := l.Allow(ctx, p, "k"); err != nil || !r.Allowed || !r.Degraded {
			t.Fatalf("in the fault: %+v %v", r, err)
		}
	}
	pending := l.Status().PendingLog
	replays := "reconcile"
	store.only.Store(&replays) // decisions and heartbeats pass; replays are refused
	time.Sleep(300 * time.Millisecond)
	if n := store.failed.Load(); n < 2 {
		t.Fatalf("%d refused calls: the replay was not retried", n)
	}
	if st := l.Status(); st.Breaker == "closed" || st.PendingLog != pending {
		t.Fatalf("with the replay refused: %+v, want not closed and %d pending", st, pending)
	}
	mu.Lock()
	path := fmt.Sprint(seen)
	mu.Unlock()
	if !strings.HasPrefix(path, "[open reconciling open reconciling open") {
		t.Fatalf("breaker path %s, want open and reconciling in turn", path)
	}
	store.heal()
	deadline := time.Now().Add(5 * time.Second)
	for l.Breaker().State() != fallback.Closed || l.Status().PendingLog > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not recovered: %+v", l.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// 4 through Redis and 6 replayed: the bucket of 10 is empty, not
	// emptier (counted twice) nor fuller (lost).
	if r, err := l.Allow(ctx, p, "k"); err != nil || r.Allowed || r.Remaining != 0 {
		t.Fatalf("after recovery: %+v %v, want a denial with 0 left", r, err)
	}
	// The bucket's credit, Redis time minus the stored zero-credit instant,
	// is within one token of zero: counted twice it would be 6 tokens
	// (6000 s) in debt.
	e, err := tokenbucket.ParseStored(srv.Do(t, "GET", driver.StorageKey(core.DefaultPrefix, "tb", "k")))
	if err != nil {
		t.Fatal(err)
	}
	credit := time.Now().UnixMicro() - e
	if token := p.Interval().Microseconds(); credit < -token || credit > token {
		t.Fatalf("bucket credit %d µs after 10 grants of capacity 10, want within one token (%d µs) of 0", credit, token)
	}
}

// TestOverMemoryStore: over a store in this process the fallback limiter
// says its decisions are local, not Redis's, and its probe and heartbeat
// work there (the breaker stays closed).
func TestOverMemoryStore(t *testing.T) {
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	l, err := fallback.New(store, fallback.Options{ID: "mem", Logger: testLogger(), Heartbeat: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, _ := tokenbucket.Policy("tb", 2, 0.001)
	admitted := 0
	for i := range 4 {
		r, err := l.Allow(context.Background(), p, "k")
		if err != nil || r.Mode != core.ModeLocal || r.Degraded {
			t.Fatalf("request %d: %+v %v, want mode local, not degraded", i, r, err)
		}
		if r.Allowed {
			admitted++
		}
	}
	time.Sleep(50 * time.Millisecond)
	if admitted != 2 || l.Breaker().State() != fallback.Closed || l.Status().Instances != 1 {
		t.Fatalf("admitted %d of capacity 2, %+v", admitted, l.Status())
	}
}

// TestNewIDOption: the request ids a sliding window keeps come from
// Options.NewID, as core.Options.NewID does for core's limiter.
func TestNewIDOption(t *testing.T) {
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var n atomic.Int64
	l, err := fallback.New(store, fallback.Options{ID: "ids", Logger: testLogger(),
		NewID: func() string { return "id-" + strconv.FormatInt(n.Add(1), 10) }})
	if err != nil {
		t.Fatal(err)
	}
	l.MarkStarted() // decides only: no background work
	p, _ := slidingwindow.Policy("sw", 10, time.Minute)
	for range 3 {
		if _, err := l.Allow(context.Background(), p, "k"); err != nil {
			t.Fatal(err)
		}
	}
	if n.Load() != 3 {
		t.Fatalf("NewID called %d times for 3 sliding window decisions", n.Load())
	}
}

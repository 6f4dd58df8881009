package metrics_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/metrics"
)

// fakeStore answers every call with reply or err.
type fakeStore struct {
	reply []int64
	err   error
}

func (f *fakeStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return f.reply, f.err
}

type pingStore struct{ fakeStore }

func (p *pingStore) Ping(context.Context) error { return p.err }

type pipeStore struct{ fakeStore }

func (p *pipeStore) RunMany(_ context.Context, calls []driver.Call) []driver.CallResult {
	out := make([]driver.CallResult, len(calls))
	for i := range out {
		out[i] = driver.CallResult{Reply: p.reply, Err: p.err}
	}
	return out
}

type bothStore struct{ pingStore }

func (b *bothStore) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	return (&pipeStore{b.fakeStore}).RunMany(ctx, calls)
}

// cmdStore is a bothStore that is also a driver.Commander: the Redis
// backends' stores.
type cmdStore struct{ bothStore }

func (c *cmdStore) RunCommands(_ context.Context, cmds [][]string) []error {
	out := make([]error, len(cmds))
	for i := range out {
		out[i] = c.err
	}
	return out
}

func TestStoreKeepsCapabilities(t *testing.T) {
	tests := []struct {
		name            string
		store           driver.Store
		ping, pipe, cmd bool
	}{
		{"plain", &fakeStore{}, false, false, false},
		{"pinger", &pingStore{}, true, false, false},
		{"pipeliner", &pipeStore{}, false, true, false},
		{"both", &bothStore{}, true, true, false},
		{"commander", &cmdStore{}, true, true, true},
	}
	for _, tt := range tests {
		s := metrics.New().Store(tt.store)
		_, ping := s.(driver.Pinger)
		_, pipe := s.(driver.Pipeliner)
		_, cmd := s.(driver.Commander)
		if ping != tt.ping || pipe != tt.pipe || cmd != tt.cmd {
			t.Errorf("%s: wrapped store is Pinger %v, Pipeliner %v, Commander %v; want %v, %v, %v", tt.name, ping, pipe, cmd, tt.ping, tt.pipe, tt.cmd)
		}
	}
}

func TestStoreTimesCalls(t *testing.T) {
	m := metrics.New()
	ok := m.Store(&cmdStore{bothStore{pingStore{fakeStore{reply: []int64{1}}}}})
	bad := m.Store(&cmdStore{bothStore{pingStore{fakeStore{err: core.ErrStoreUnavailable}}}})
	script := driver.NewScript("tokenbucket", "return 1", nil)
	ctx := context.Background()
	for _, s := range []driver.Store{ok, bad} {
		s.Run(ctx, script, []string{"k"}, nil)
		s.Run(ctx, script, []string{"k"}, nil)
		s.(driver.Pinger).Ping(ctx)
		s.(driver.Pipeliner).RunMany(ctx, []driver.Call{{Script: script}, {Script: script}})
		s.(driver.Commander).RunCommands(ctx, [][]string{{"ZADD", "k", "1", "m"}, {"PEXPIRE", "k", "10"}})
	}
	out := scrape(t, m)
	for _, want := range []string{
		`holdfast_redis_call_duration_seconds_count{outcome="ok",script="tokenbucket"} 2`,
		`holdfast_redis_call_duration_seconds_count{outcome="error",script="tokenbucket"} 2`,
		`holdfast_redis_call_duration_seconds_count{outcome="ok",script="ping"} 1`,
		`holdfast_redis_call_duration_seconds_count{outcome="error",script="ping"} 1`,
		`holdfast_redis_call_duration_seconds_count{outcome="ok",script="pipeline"} 1`,
		`holdfast_redis_call_duration_seconds_count{outcome="error",script="pipeline"} 1`,
		`holdfast_redis_call_duration_seconds_count{outcome="ok",script="commands"} 1`,
		`holdfast_redis_call_duration_seconds_count{outcome="error",script="commands"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

func TestDecisionsNeverLabelTheKey(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	store, err := memory.New(memory.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim, err := core.NewLimiter(store, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := tokenbucket.Policy("api", 2, 1)
	m := metrics.New()
	d := m.Limiter(lim)
	const key = "secret-client-key-42"
	for range 3 {
		d.AllowN(context.Background(), p, key, 1)
	}
	if _, err := d.AllowN(context.Background(), p, "", 1); !errors.Is(err, core.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	out := scrape(t, m)
	for _, want := range []string{
		`holdfast_decisions_total{mode="local",policy="api",result="allowed"} 2`,
		`holdfast_decisions_total{mode="local",policy="api",result="denied"} 1`,
		`holdfast_decisions_total{mode="none",policy="api",result="error"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(out, key) {
		t.Error("the client key appears in the scrape")
	}
}

func TestBreakerAndStatus(t *testing.T) {
	m := metrics.New()
	st := fallback.Status{PendingLog: 7, Instances: 4, PendingRefunds: 2, LostRefunds: 5, Reconciles: 3, RestoredKeys: 6, LastRecon: 1500 * time.Millisecond}
	m.Watch(func() fallback.Status { return st })
	m.Watch(func() fallback.Status { return st }) // a second call is a no-op, not a panic
	m.BreakerChange(fallback.Closed, fallback.Open)
	m.BreakerChange(fallback.Open, fallback.Reconciling)
	out := scrape(t, m)
	for _, want := range []string{
		`holdfast_breaker_state{state="closed"} 0`,
		`holdfast_breaker_state{state="open"} 0`,
		`holdfast_breaker_state{state="reconciling"} 1`,
		`holdfast_breaker_transitions_total{from="closed",to="open"} 1`,
		`holdfast_breaker_transitions_total{from="open",to="reconciling"} 1`,
		"holdfast_pending_log_grants 7",
		"holdfast_instances 4",
		"holdfast_pending_refunds 2",
		"holdfast_lost_refunds_total 5",
		"holdfast_reconciles_total 3",
		"holdfast_restored_keys_total 6",
		"holdfast_last_reconcile_duration_seconds 1.5",
		"go_goroutines",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if n := testutil.CollectAndCount(m.Registry(), "holdfast_breaker_state"); n != 3 {
		t.Errorf("%d breaker_state series, want 3", n)
	}
}

func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 {
		t.Fatalf("scrape: %d %s", w.Code, w.Body)
	}
	return w.Body.String()
}

// TestStoreErrorsByClass: failed calls are counted by class and a reason
// from the bounded set; a reason outside it (another store's own) is
// "other", and the message text never becomes a label.
func TestStoreErrorsByClass(t *testing.T) {
	m := metrics.New()
	script := driver.NewScript("tokenbucket", "return 1", nil)
	ctx := context.Background()
	for _, err := range []error{
		&core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed, key secret-1")},
		&core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed, key secret-2")},
		&core.StoreError{Class: core.ClassUnavailable, Reason: "deadline", Err: context.DeadlineExceeded},
		&core.StoreError{Class: core.ClassUnknown, Reason: "made up by a store", Err: errors.New("ERR x")},
		driver.Errorf(core.ErrMalformedReply, "reply is a string"),
		core.ErrWrongType,
	} {
		m.Store(&fakeStore{err: err}).Run(ctx, script, []string{"k"}, nil)
	}
	out := scrape(t, m)
	for _, want := range []string{
		`holdfast_store_errors_total{class="unavailable",reason="OOM"} 2`,
		`holdfast_store_errors_total{class="unavailable",reason="deadline"} 1`,
		`holdfast_store_errors_total{class="unknown",reason="other"} 1`,
		`holdfast_store_errors_total{class="unknown",reason="malformed"} 1`,
		`holdfast_store_errors_total{class="request",reason="request"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(out, "secret") {
		t.Error("an error's text reached a label")
	}
}

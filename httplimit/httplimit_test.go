package httplimit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
)

var _ Limiter = (*fallback.Limiter)(nil)

// fake is a Limiter that returns a fixed decision and records its calls.
type fake struct {
	res   core.Result
	err   error
	calls int
	key   string
	cost  int64
}

func (f *fake) AllowN(_ context.Context, _ core.Policy, key string, cost int64) (core.Result, error) {
	f.calls++
	f.key, f.cost = key, cost
	return f.res, f.err
}

func mustTB(t testing.TB, name string, capacity int64, perSecond float64) core.Policy {
	t.Helper()
	p, err := tokenbucket.Policy(name, capacity, perSecond)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustSW(t testing.TB, name string, limit int64, window time.Duration) core.Policy {
	t.Helper()
	p, err := slidingwindow.Policy(name, limit, window)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func headerKey(testing.TB) KeyFunc { return Header("X-Client-ID") }

// do sends one request with X-Client-ID: key (none if key is "") through
// the middleware in front of AllowedJSON.
func do(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/api", nil)
	if key != "" {
		r.Header.Set("X-Client-ID", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHeaders(t *testing.T) {
	tb := mustTB(t, "tb", 20, 5)                         // refills 20 in 4s
	sw := mustSW(t, "sw", 20, 2*time.Second)             // window 2s
	swShort := mustSW(t, "sw", 20, 100*time.Millisecond) // w rounds up to 1
	tests := []struct {
		name                 string
		p                    core.Policy
		res                  core.Result
		status               int
		policy, limit, retry string
		body                 string
	}{
		{"token bucket", tb, core.Result{Allowed: true, Limit: 20, Remaining: 5, ResetAfter: 3 * time.Second, Mode: core.ModeRedis},
			200, `"tb";q=20;w=4`, `"tb";r=5;t=3`, "", `{"allowed":true,"remaining":5,"mode":"redis","policy":"tb"}`},
		{"token bucket, reset rounded up", tb, core.Result{Allowed: true, Limit: 20, Remaining: 8, ResetAfter: 2200 * time.Millisecond, Mode: core.ModeRedis},
			200, `"tb";q=20;w=4`, `"tb";r=8;t=3`, "", `{"allowed":true,"remaining":8,"mode":"redis","policy":"tb"}`},
		{"token bucket denied", tb, core.Result{Limit: 20, RetryAfter: 150 * time.Millisecond, ResetAfter: 3950 * time.Millisecond, Mode: core.ModeRedis},
			429, `"tb";q=20;w=4`, `"tb";r=0;t=1`, "1", `{"allowed":false,"remaining":0,"mode":"redis","retry_after_ms":150,"policy":"tb"}`},
		{"token bucket degraded", tb, core.Result{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 2400 * time.Millisecond, Mode: core.ModeLocal, Degraded: true},
			200, `"tb";q=5;w=4`, `"tb";r=2;t=3`, "", `{"allowed":true,"remaining":2,"mode":"local","policy":"tb"}`},
		{"token bucket degraded denied", tb, core.Result{Limit: 5, RetryAfter: 800 * time.Millisecond, ResetAfter: 4 * time.Second, Mode: core.ModeLocal, Degraded: true},
			429, `"tb";q=5;w=4`, `"tb";r=0;t=1`, "1", `{"allowed":false,"remaining":0,"mode":"local","retry_after_ms":800,"policy":"tb"}`},
		{"sliding window", sw, core.Result{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 2 * time.Second, Mode: core.ModeRedis},
			200, `"sw";q=20;w=2`, `"sw";r=19;t=2`, "", `{"allowed":true,"remaining":19,"mode":"redis","policy":"sw"}`},
		{"sliding window denied", sw, core.Result{Limit: 20, RetryAfter: 1500 * time.Millisecond, ResetAfter: 1999 * time.Millisecond, Mode: core.ModeRedis},
			429, `"sw";q=20;w=2`, `"sw";r=0;t=2`, "2", `{"allowed":false,"remaining":0,"mode":"redis","retry_after_ms":1500,"policy":"sw"}`},
		{"sliding window degraded", sw, core.Result{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 2 * time.Second, Mode: core.ModeLocal, Degraded: true},
			200, `"sw";q=10;w=2`, `"sw";r=3;t=2`, "", `{"allowed":true,"remaining":3,"mode":"local","policy":"sw"}`},
		{"sliding window degraded denied", sw, core.Result{Limit: 10, RetryAfter: 300 * time.Millisecond, ResetAfter: 1900 * time.Millisecond, Mode: core.ModeLocal, Degraded: true},
			429, `"sw";q=10;w=2`, `"sw";r=0;t=1`, "1", `{"allowed":false,"remaining":0,"mode":"local","retry_after_ms":300,"policy":"sw"}`},
		{"window under a second", swShort, core.Result{Allowed: true, Limit: 20, Remaining: 0, ResetAfter: 100 * time.Millisecond, Mode: core.ModeRedis},
			200, `"sw";q=20;w=1`, `"sw";r=0;t=1`, "", `{"allowed":true,"remaining":0,"mode":"redis","policy":"sw"}`},
		{"fail closed", tb, core.Result{Limit: 20, RetryAfter: time.Second, Mode: core.ModeFailClosed, Degraded: true},
			429, `"tb";q=20;w=4`, `"tb";r=0;t=1`, "1", `{"allowed":false,"remaining":0,"mode":"fail_closed","retry_after_ms":1000,"policy":"tb"}`},
		{"fail open", tb, core.Result{Allowed: true, Limit: 20, Remaining: 20, Mode: core.ModeFailOpen, Degraded: true},
			200, `"tb";q=20;w=4`, `"tb";r=20;t=0`, "", `{"allowed":true,"remaining":20,"mode":"fail_open","policy":"tb"}`},
		{"debt shows as zero", tb, core.Result{Limit: 20, Remaining: -3, RetryAfter: 5 * time.Second, ResetAfter: 8 * time.Second, Mode: core.ModeRedis},
			429, `"tb";q=20;w=4`, `"tb";r=0;t=5`, "5", `{"allowed":false,"remaining":0,"mode":"redis","retry_after_ms":5000,"policy":"tb"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := New(&fake{res: tt.res}, Rule{Policy: tt.p, Key: headerKey(t)})(http.HandlerFunc(AllowedJSON))
			w := do(h, "client-42")
			got := []string{fmt.Sprint(w.Code), w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), w.Header().Get("Retry-After"), strings.TrimSpace(w.Body.String()), w.Header().Get("Content-Type")}
			want := []string{fmt.Sprint(tt.status), tt.policy, tt.limit, tt.retry, tt.body, "application/json"}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("got %q, want %q", got, want)
					break
				}
			}
			// Fields gives other transports the same values.
			policy, limit, retry := Fields(tt.p, tt.res)
			if got, want := []string{policy, limit, retry}, []string{tt.policy, tt.limit, tt.retry}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("Fields = %q, want %q", got, want)
			}
		})
	}
}

func TestWindow(t *testing.T) {
	tests := []struct {
		p    core.Policy
		want int64
	}{
		{mustTB(t, "a", 3, 1), 3},
		{mustTB(t, "a", 10, 4), 3},   // 2.5s rounds up
		{mustTB(t, "a", 1, 1000), 1}, // 1ms: at least 1
		{mustTB(t, "a", 5, 0.5), 10}, // 2s a token
		{mustSW(t, "a", 5, time.Minute), 60},
		{mustSW(t, "a", 5, 1001*time.Millisecond), 2},
		{core.Policy{}, 1},
	}
	for _, tt := range tests {
		if got := window(tt.p); got != tt.want {
			t.Errorf("window(%v) = %d, want %d", tt.p, got, tt.want)
		}
	}
}

func TestRetryAfterRounding(t *testing.T) {
	tests := []struct {
		retry  time.Duration
		header string
		ms     int64
	}{
		{0, "1", 1},
		{time.Nanosecond, "1", 1},
		{1500 * time.Microsecond, "1", 2},
		{999 * time.Millisecond, "1", 999},
		{time.Second, "1", 1000},
		{time.Second + time.Microsecond, "2", 1001},
		{59*time.Second + 100*time.Microsecond, "60", 59001},
		{2 * time.Hour, "7200", 7_200_000},
	}
	p := mustTB(t, "tb", 20, 5)
	for _, tt := range tests {
		h := New(&fake{res: core.Result{Limit: 20, RetryAfter: tt.retry, Mode: core.ModeRedis}}, Rule{Policy: p, Key: headerKey(t)})(http.HandlerFunc(AllowedJSON))
		w := do(h, "c")
		wantBody := fmt.Sprintf(`"retry_after_ms":%d,`, tt.ms)
		if w.Code != 429 || w.Header().Get("Retry-After") != tt.header || !strings.Contains(w.Body.String(), wantBody) {
			t.Errorf("RetryAfter %v: %d, Retry-After %q, body %s; want Retry-After %s and %s", tt.retry, w.Code, w.Header().Get("Retry-After"), w.Body, tt.header, wantBody)
		}
		// Retry-After is never earlier than the end of the effective window.
		if rl := w.Header().Get("RateLimit"); !strings.HasSuffix(rl, ";t="+tt.header) {
			t.Errorf("RetryAfter %v: RateLimit %q, want t=%s", tt.retry, rl, tt.header)
		}
	}
}

func TestMissingKey(t *testing.T) {
	f := &fake{res: core.Result{Allowed: true, Mode: core.ModeRedis}}
	h := New(f, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)})(http.HandlerFunc(AllowedJSON))
	w := do(h, "")
	if w.Code != 400 || strings.TrimSpace(w.Body.String()) != `{"error":"missing header X-Client-ID"}` || w.Header().Get("Content-Type") != "application/json" {
		t.Errorf("got %d %s %q", w.Code, w.Body, w.Header())
	}
	if f.calls != 0 || w.Header().Get("RateLimit") != "" {
		t.Errorf("limiter called %d times, RateLimit %q", f.calls, w.Header().Get("RateLimit"))
	}
}

// TestRuleErrors: a rule the limiter rejects is the server's error, a 500
// that reveals nothing and is logged at Error with the policy, never the
// key; a request that ended is a 503 and is not logged.
func TestRuleErrors(t *testing.T) {
	const key = "client-secret-42"
	tests := []struct {
		name string
		err  error
	}{
		{"invalid cost", fmt.Errorf("%w: cost 0 must be at least 1", core.ErrInvalidCost)},
		{"invalid policy", fmt.Errorf("%w: zero Policy", core.ErrInvalidPolicy)},
		{"unknown policy", fmt.Errorf("%w: no policy named %q", core.ErrUnknownPolicy, "tb")},
		{"key too long", fmt.Errorf("%w: key of 600 bytes", core.ErrKeyTooLong)},
	}
	for _, tt := range tests {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		h := New(&fake{err: tt.err}, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)}, WithLogger(log))(http.HandlerFunc(AllowedJSON))
		w := do(h, key)
		if w.Code != 500 || strings.TrimSpace(w.Body.String()) != `{"error":"internal error"}` || w.Header().Get("RateLimit") != "" {
			t.Errorf("%s: got %d %s %q", tt.name, w.Code, w.Body, w.Header())
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "policy=tb") || strings.Contains(logs.String(), key) {
			t.Errorf("%s: log %q, want ERROR with the policy and without the key", tt.name, logs.String())
		}
	}
	// A client that went away is not logged and not passed on.
	var logs bytes.Buffer
	next := 0
	h := New(&fake{err: context.Canceled}, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)}, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { next++ }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
	r.Header.Set("X-Client-ID", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 503 || strings.TrimSpace(w.Body.String()) != `{"error":"request cancelled"}` || logs.Len() != 0 || next != 0 {
		t.Errorf("cancelled: %d %s, log %q, next called %d times", w.Code, w.Body, logs.String(), next)
	}
}

func TestNewPanics(t *testing.T) {
	p := mustTB(t, "tb", 20, 5)
	for name, f := range map[string]func(){
		"nil limiter": func() { New(nil, Rule{Policy: p, Key: headerKey(t)}) },
		"nil key":     func() { New(&fake{}, Rule{Policy: p}) },
		"zero policy": func() { New(&fake{}, Rule{Key: headerKey(t)}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: New did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestLongKeyHashed(t *testing.T) {
	long := strings.Repeat("x", 200)
	sum := sha256.Sum256([]byte(long))
	f := &fake{res: core.Result{Allowed: true, Limit: 20, Mode: core.ModeRedis}}
	h := New(f, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)})(http.HandlerFunc(AllowedJSON))
	if w := do(h, long); w.Code != 200 {
		t.Fatalf("got %d", w.Code)
	}
	if want := "sha256:" + hex.EncodeToString(sum[:]); f.key != want {
		t.Errorf("limiter got key %q, want %q", f.key, want)
	}
}

func TestFromContext(t *testing.T) {
	want := core.Result{Allowed: true, Limit: 20, Remaining: 7, ResetAfter: time.Second, Mode: core.ModeLocal, Degraded: true}
	var got core.Result
	var ok bool
	h := New(&fake{res: want}, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok = FromContext(r.Context())
	}))
	do(h, "c")
	if !ok || got != want {
		t.Errorf("FromContext = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := FromContext(context.Background()); ok {
		t.Error("FromContext of a bare context reports a decision")
	}
	w := httptest.NewRecorder()
	AllowedJSON(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 500 {
		t.Errorf("AllowedJSON without a decision: %d", w.Code)
	}
}

func TestNested(t *testing.T) {
	burst := New(&fake{res: core.Result{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 200 * time.Millisecond, Mode: core.ModeRedis}}, Rule{Policy: mustTB(t, "burst", 20, 5), Key: headerKey(t)})
	daily := New(&fake{res: core.Result{Allowed: true, Limit: 1000, Remaining: 900, ResetAfter: time.Hour, Mode: core.ModeRedis}}, Rule{Policy: mustSW(t, "daily", 1000, 24*time.Hour), Key: headerKey(t)})
	w := do(burst(daily(http.HandlerFunc(AllowedJSON))), "c")
	got := fmt.Sprint(w.Header().Values("RateLimit-Policy"), w.Header().Values("RateLimit"))
	want := `["burst";q=20;w=4 "daily";q=1000;w=86400] ["burst";r=19;t=1 "daily";r=900;t=3600]`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestSFString(t *testing.T) {
	for in, want := range map[string]string{"tb": `"tb"`, `a"b\c`: `"a\"b\\c"`, "a\nb\xff": `"ab"`} {
		if got := sfString(in); got != want {
			t.Errorf("sfString(%q) = %s, want %s", in, got, want)
		}
	}
}

// frozenLimiter is a core.Limiter over a memory store whose clock stands
// still.
func frozenLimiter(t *testing.T) *core.Limiter {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	store, err := memory.New(memory.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	lim, err := core.NewLimiter(store, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// TestMemoryLimiter drives a real core.Limiter over the memory store: a
// bucket of 20 admits exactly 20 of 25 requests at one instant.
func TestMemoryLimiter(t *testing.T) {
	lim := frozenLimiter(t)
	h := New(lim, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)})(http.HandlerFunc(AllowedJSON))
	for i := 1; i <= 25; i++ {
		w := do(h, "client-42")
		wantCode, wantRL := 200, fmt.Sprintf(`"tb";r=%d;t=%d`, 20-i, ceil(i, 5))
		if i > 20 {
			// Empty: the next token is 200ms away; full again in 4s.
			wantCode, wantRL = 429, `"tb";r=0;t=1`
		}
		if w.Code != wantCode || w.Header().Get("RateLimit") != wantRL || w.Header().Get("RateLimit-Policy") != `"tb";q=20;w=4` {
			t.Fatalf("request %d: %d %q %q, want %d %q", i, w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), wantCode, wantRL)
		}
		if i > 20 && (w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), `"retry_after_ms":200,`)) {
			t.Fatalf("request %d: Retry-After %q, body %s", i, w.Header().Get("Retry-After"), w.Body)
		}
	}
	// Another client has its own bucket.
	if w := do(h, "client-43"); w.Code != 200 {
		t.Errorf("another client: %d", w.Code)
	}
}

// ceil is ⌈a/b⌉ for positive ints.
func ceil(a, b int) int { return (a + b - 1) / b }

// TestAlso: a route limited by a bucket of 5 (1/s) and a window of 3 per
// minute, charged together over the memory store: 3 admitted, then the
// window denies and the bucket is not spent by the denials (2 left, so a
// route on the bucket alone admits 2 more); the header fields list both
// policies, Retry-After is the window's.
func TestAlso(t *testing.T) {
	lim := frozenLimiter(t)
	tb, sw := mustTB(t, "tb", 5, 1), mustSW(t, "sw", 3, time.Minute)
	h := New(lim, Rule{Policy: tb, Also: []core.Policy{sw}, Key: headerKey(t)}, WithXRateLimit())(http.HandlerFunc(AllowedJSON))
	for i := 1; i <= 6; i++ {
		w := do(h, "c")
		pol, rl := w.Header().Values("RateLimit-Policy"), w.Header().Values("RateLimit")
		wantPol := []string{`"tb";q=5;w=5`, `"sw";q=3;w=60`}
		wantRL := []string{fmt.Sprintf(`"tb";r=%d;t=%d`, 5-i, i), fmt.Sprintf(`"sw";r=%d;t=60`, 3-i)}
		wantCode, wantX := 200, strconv.Itoa(min(5-i, 3-i))
		if i > 3 {
			// The window denies (its retry: 60 s); the bucket admits
			// alone, with 1 left after it.
			wantCode, wantX = 429, "0"
			wantRL = []string{`"tb";r=1;t=4`, `"sw";r=0;t=60`}
		}
		if w.Code != wantCode || !slices.Equal(pol, wantPol) || !slices.Equal(rl, wantRL) || w.Header().Get("X-RateLimit-Remaining") != wantX {
			t.Fatalf("request %d: %d %q %q X-Remaining %q; want %d %q %q %q", i, w.Code, pol, rl, w.Header().Get("X-RateLimit-Remaining"), wantCode, wantPol, wantRL, wantX)
		}
		if i > 3 && w.Header().Get("Retry-After") != "60" {
			t.Fatalf("request %d: Retry-After %q, want the window's 60", i, w.Header().Get("Retry-After"))
		}
	}
	alone := New(lim, Rule{Policy: tb, Key: headerKey(t)})(http.HandlerFunc(AllowedJSON))
	for i, want := range []int{200, 200, 429} {
		if w := do(alone, "c"); w.Code != want {
			t.Fatalf("bucket alone, request %d: %d, want %d: the denied requests spent it", i+1, w.Code, want)
		}
	}
	// A limiter that cannot charge several policies is refused.
	defer func() {
		if recover() == nil {
			t.Fatal("New with Also over a plain Decider did not panic")
		}
	}()
	New(&fake{}, Rule{Policy: tb, Also: []core.Policy{sw}, Key: headerKey(t)})
}

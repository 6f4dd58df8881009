package httplimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// faulty is a driver.Store that fails every call with err while err is set,
// and otherwise runs the memory store it wraps.
type faulty struct {
	inner *memory.Store
	err   error
}

func (f *faulty) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	if f.err != nil {
		return nil, f.err
	}
	return f.inner.Run(ctx, s, keys, args)
}

func (f *faulty) Unwrap() driver.Store { return f.inner }

// memLimiter is a core.Limiter over a faulty memory store at a fixed
// instant.
func memLimiter(t *testing.T) (*core.Limiter, *faulty) {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	store, err := memory.New(memory.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	f := &faulty{inner: store}
	lim, err := core.NewLimiter(f, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return lim, f
}

// response is what a test compares: status, the RateLimit and Retry-After
// fields, and the body.
func response(w *httptest.ResponseRecorder) string {
	return fmt.Sprintf("%d %s | %s | %s | %s", w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), w.Header().Get("Retry-After"), strings.TrimSpace(w.Body.String()))
}

// TestStoreErrorsNever500: a store failing with each error class, through
// a core.Limiter (which returns store errors), gives the Rule's Outage
// decision with exact fields, never a 500; the log names the class at
// Warn (Error for WRONGTYPE, which will not heal) and never the key.
func TestStoreErrorsNever500(t *testing.T) {
	errs := []struct {
		name, class, level string
		err                error
	}{
		{"OOM reply", "unavailable", "WARN", &core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed when used memory > 'maxmemory'")}},
		{"connection refused", "unavailable", "WARN", fmt.Errorf("%w: dial tcp 10.0.0.7:6379: connection refused", core.ErrStoreUnavailable)},
		{"store deadline", "unavailable", "WARN", fmt.Errorf("goredis: run tb: %w", context.DeadlineExceeded)},
		{"unknown reply", "unknown", "WARN", &core.StoreError{Class: core.ClassUnknown, Reason: "unknown", Answered: true, Err: errors.New("ERR something new")}},
		{"malformed reply", "unknown", "WARN", fmt.Errorf("%w: reply [1 2]", core.ErrMalformedReply)},
		{"WRONGTYPE", "request", "ERROR", &core.StoreError{Class: core.ClassRequest, Reason: "WRONGTYPE", Answered: true, Err: errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")}},
		{"bare wrong type", "request", "ERROR", fmt.Errorf("%w: hf:{tb:x}", core.ErrWrongType)},
	}
	outages := []struct {
		outage Outage
		want   string
	}{
		{FailOpen, `200 "tb";q=3;w=3 | "tb";r=3;t=0 |  | {"allowed":true,"remaining":3,"mode":"fail_open","policy":"tb"}`},
		{FailClosed, `429 "tb";q=3;w=3 | "tb";r=0;t=1 | 1 | {"allowed":false,"remaining":0,"mode":"fail_closed","retry_after_ms":1000,"policy":"tb"}`},
	}
	for _, o := range outages {
		for _, e := range errs {
			t.Run(o.outage.String()+"/"+e.name, func(t *testing.T) {
				lim, store := memLimiter(t)
				var logs bytes.Buffer
				rule := Rule{Policy: mustTB(t, "tb", 3, 1), Key: headerKey(t), Outage: o.outage}
				h := New(lim, rule, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))(http.HandlerFunc(AllowedJSON))
				store.err = e.err
				if got := response(do(h, "client-secret")); got != o.want {
					t.Errorf("got  %s\nwant %s", got, o.want)
				}
				for _, want := range []string{"level=" + e.level, "policy=tb", "class=" + e.class, "outage=" + o.outage.String()} {
					if !strings.Contains(logs.String(), want) {
						t.Errorf("log %q lacks %s", logs.String(), want)
					}
				}
				if strings.Contains(logs.String(), "client-secret") {
					t.Errorf("log names the key: %q", logs.String())
				}
				// Healed, the store decides again: nothing was spent.
				store.err = nil
				if got, want := response(do(h, "client-secret")), `200 "tb";q=3;w=3 | "tb";r=2;t=1 |  | {"allowed":true,"remaining":2,"mode":"local","policy":"tb"}`; got != want {
					t.Errorf("healed: got %s, want %s", got, want)
				}
			})
		}
	}
}

func TestExempt(t *testing.T) {
	f := &fake{res: core.Result{Allowed: true, Limit: 20, Remaining: 19, Mode: core.ModeRedis}}
	rule := Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t), Exempt: func(r *http.Request) bool { return r.Method == http.MethodOptions }}
	var decided []bool
	h := New(f, rule)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := FromContext(r.Context())
		decided = append(decided, ok)
	}))
	for _, method := range []string{"OPTIONS", "GET", "OPTIONS"} {
		r := httptest.NewRequest(method, "/", nil) // no key: an exempt request needs none
		if method == "GET" {
			r.Header.Set("X-Client-ID", "c")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		want := `"tb";r=19;t=0`
		if method == "OPTIONS" {
			want = ""
		}
		if w.Code != 200 || w.Header().Get("RateLimit") != want {
			t.Errorf("%s: %d RateLimit %q, want 200 %q", method, w.Code, w.Header().Get("RateLimit"), want)
		}
	}
	if f.calls != 1 || fmt.Sprint(decided) != "[false true false]" {
		t.Errorf("limiter called %d times, decisions %v; want 1, [false true false]", f.calls, decided)
	}
}

// TestCostFunc: a POST costs 2 against a bucket of 5, exactly.
func TestCostFunc(t *testing.T) {
	lim, _ := memLimiter(t)
	rule := Rule{Policy: mustTB(t, "tb", 5, 1), Key: headerKey(t), Cost: func(r *http.Request) (int64, error) {
		switch r.URL.Path {
		case "/batch":
			return int64(len(r.URL.Query()["id"])), nil
		case "/broken":
			return 0, nil
		case "/refused":
			return 0, &ClientError{Reason: "unreadable batch"}
		}
		if r.Method == http.MethodPost {
			return 2, nil
		}
		return 1, nil
	}}
	var logs bytes.Buffer
	h := New(lim, rule, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))(http.HandlerFunc(AllowedJSON))
	steps := []struct{ method, path, want string }{
		{"POST", "/", `200 "tb";q=5;w=5 | "tb";r=3;t=2 |  | {"allowed":true,"remaining":3,"mode":"local","policy":"tb"}`},
		{"GET", "/", `200 "tb";q=5;w=5 | "tb";r=2;t=3 |  | {"allowed":true,"remaining":2,"mode":"local","policy":"tb"}`},
		{"POST", "/", `200 "tb";q=5;w=5 | "tb";r=0;t=5 |  | {"allowed":true,"remaining":0,"mode":"local","policy":"tb"}`},
		{"POST", "/", `429 "tb";q=5;w=5 | "tb";r=0;t=2 | 2 | {"allowed":false,"remaining":0,"mode":"local","retry_after_ms":2000,"policy":"tb"}`},
		{"GET", "/batch?id=1&id=2&id=3&id=4&id=5&id=6", `400  |  |  | {"error":"request costs 6, above the limit 5 of policy tb"}`},
		{"GET", "/refused", `400  |  |  | {"error":"unreadable batch"}`},
		{"GET", "/broken", `500  |  |  | {"error":"internal error"}`},
	}
	for i, s := range steps {
		r := httptest.NewRequest(s.method, s.path, nil)
		r.Header.Set("X-Client-ID", "c")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := response(w); got != s.want {
			t.Errorf("step %d %s %s:\ngot  %s\nwant %s", i, s.method, s.path, got, s.want)
		}
	}
	// Only the cost below 1 is the server's error, logged once.
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "invalid cost") {
		t.Errorf("log %q, want one ERROR naming the invalid cost", logs.String())
	}
}

func TestKeyFuncErrors(t *testing.T) {
	tests := []struct {
		name string
		key  KeyFunc
		want string
		logs bool
	}{
		{"client error", func(*http.Request) (string, error) { return "", &ClientError{Reason: "missing bearer token"} }, `400  |  |  | {"error":"missing bearer token"}`, false},
		{"empty key", func(*http.Request) (string, error) { return "", nil }, `400  |  |  | {"error":"empty client key"}`, false},
		{"server error", func(*http.Request) (string, error) { return "", errors.New("session store down") }, `500  |  |  | {"error":"internal error"}`, true},
	}
	for _, tt := range tests {
		f := &fake{res: core.Result{Allowed: true, Mode: core.ModeRedis}}
		var logs bytes.Buffer
		h := New(f, Rule{Policy: mustTB(t, "tb", 20, 5), Key: tt.key}, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))(http.HandlerFunc(AllowedJSON))
		if got := response(do(h, "c")); got != tt.want || f.calls != 0 {
			t.Errorf("%s: got %s (limiter called %d times), want %s", tt.name, got, f.calls, tt.want)
		}
		if logged := strings.Contains(logs.String(), "level=ERROR") && strings.Contains(logs.String(), "session store down"); logged != tt.logs {
			t.Errorf("%s: log %q, want logged %v", tt.name, logs.String(), tt.logs)
		}
	}
}

// TestCustomHandlers: the deny handler sees the decision and the fields
// already set; the error handler sees the error, and store errors never
// reach it.
func TestCustomHandlers(t *testing.T) {
	var denied core.Result
	var fromCtx bool
	var gotErr error
	opts := []Option{
		WithDenyHandler(func(w http.ResponseWriter, r *http.Request, res core.Result) {
			denied = res
			_, fromCtx = FromContext(r.Context())
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "slow down: %s, retry in %s s", w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
		}),
		WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			gotErr = err
			http.Error(w, "no key", http.StatusUnauthorized)
		}),
	}
	res := core.Result{Limit: 20, RetryAfter: 1500 * time.Millisecond, ResetAfter: 4 * time.Second, Mode: core.ModeRedis}
	h := New(&fake{res: res}, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)}, opts...)(http.HandlerFunc(AllowedJSON))
	w := do(h, "c")
	if got, want := fmt.Sprint(w.Code, " ", w.Body), `503 slow down: "tb";r=0;t=2, retry in 2 s`; got != want || denied != res || !fromCtx {
		t.Errorf("deny: %q (result %+v, in context %v), want %q", got, denied, fromCtx, want)
	}
	w = do(h, "")
	var ce *ClientError
	if w.Code != 401 || !errors.As(gotErr, &ce) || ce.Reason != "missing header X-Client-ID" {
		t.Errorf("error: %d, err %v", w.Code, gotErr)
	}
	gotErr = nil
	h = New(&fake{err: fmt.Errorf("%w: refused", core.ErrStoreUnavailable)}, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t), Outage: FailClosed}, append(opts, WithLogger(slog.New(slog.DiscardHandler)))...)(http.HandlerFunc(AllowedJSON))
	w = do(h, "c")
	want := core.Result{Limit: 20, RetryAfter: time.Second, Mode: core.ModeFailClosed, Degraded: true}
	if w.Code != 503 || denied != want || gotErr != nil {
		t.Errorf("store error: %d, denied %+v, error handler got %v; want the deny handler with %+v", w.Code, denied, gotErr, want)
	}
}

// TestXRateLimit: both header styles, exact values on 200 and 429, beside
// the IETF fields.
func TestXRateLimit(t *testing.T) {
	now := time.Unix(1_700_000_000, 300*int64(time.Millisecond))
	allowed := core.Result{Allowed: true, Limit: 20, Remaining: 5, ResetAfter: 2200 * time.Millisecond, Mode: core.ModeRedis}
	denied := core.Result{Limit: 20, Remaining: -2, RetryAfter: 150 * time.Millisecond, ResetAfter: 4 * time.Second, Mode: core.ModeRedis}
	slow := core.Result{Limit: 20, RetryAfter: 2800 * time.Millisecond, ResetAfter: 4 * time.Second, Mode: core.ModeRedis}
	tests := []struct {
		name string
		opt  []Option
		res  core.Result
		want string // status, RateLimit, X-RateLimit-Limit, -Remaining, -Reset
	}{
		{"IETF only", nil, allowed, `200 "tb";r=5;t=3   `},
		{"delta 200", []Option{WithXRateLimit()}, allowed, `200 "tb";r=5;t=3 20 5 3`},
		{"delta 429", []Option{WithXRateLimit()}, denied, `429 "tb";r=0;t=1 20 0 1`},
		{"unix 200", []Option{WithXRateLimitUnix(), WithClock(func() time.Time { return now })}, allowed, `200 "tb";r=5;t=3 20 5 1700000003`},
		{"unix 429", []Option{WithXRateLimitUnix(), WithClock(func() time.Time { return now })}, denied, `429 "tb";r=0;t=1 20 0 1700000002`},
		{"unix 429 slow", []Option{WithXRateLimitUnix(), WithClock(func() time.Time { return now })}, slow, `429 "tb";r=0;t=3 20 0 1700000004`},
		{"unix on the second", []Option{WithXRateLimitUnix(), WithClock(func() time.Time { return time.Unix(1_700_000_000, 0) })}, core.Result{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 2 * time.Second}, `200 "tb";r=19;t=2 20 19 1700000002`},
	}
	for _, tt := range tests {
		h := New(&fake{res: tt.res}, Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)}, tt.opt...)(http.HandlerFunc(AllowedJSON))
		w := do(h, "c")
		got := fmt.Sprint(w.Code, " ", w.Header().Get("RateLimit"), " ", w.Header().Get("X-RateLimit-Limit"), " ", w.Header().Get("X-RateLimit-Remaining"), " ", w.Header().Get("X-RateLimit-Reset"))
		if got != tt.want || w.Header().Get("RateLimit-Policy") != `"tb";q=20;w=4` {
			t.Errorf("%s: got %q, want %q (policy %q)", tt.name, got, tt.want, w.Header().Get("RateLimit-Policy"))
		}
	}
}

// TestLogSpaced: through an outage the middleware logs a store error at
// most once a second, with the count of lines it left out; undecided
// requests are spaced on their own.
func TestLogSpaced(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var logs bytes.Buffer
	f := &fake{err: fmt.Errorf("%w: refused", core.ErrStoreUnavailable)}
	rule := Rule{Policy: mustTB(t, "tb", 20, 5), Key: headerKey(t)}
	h := New(f, rule, WithClock(func() time.Time { return now }), WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "err" || a.Key == "path" {
				return slog.Attr{}
			}
			return a
		},
	}))))(http.HandlerFunc(AllowedJSON))
	step := func(n int, advance time.Duration) {
		for range n {
			if w := do(h, "c"); w.Code != 200 && w.Code != 500 {
				t.Fatalf("got %d", w.Code)
			}
		}
		now = now.Add(advance)
	}
	step(3, 999*time.Millisecond)
	step(1, time.Millisecond) // still within the second: left out
	step(2, 0)
	f.err = fmt.Errorf("%w: cost 0 must be at least 1", core.ErrInvalidCost) // the server's error
	step(2, 0)
	want := `level=WARN msg="httplimit: store failed, request decided by the outage mode" policy=tb outage=fail_open class=unavailable reason=network
level=WARN msg="httplimit: store failed, request decided by the outage mode" policy=tb outage=fail_open class=unavailable reason=network suppressed=3
level=ERROR msg="httplimit: request not decided" policy=tb
`
	if logs.String() != want {
		t.Errorf("log:\n%s\nwant:\n%s", logs.String(), want)
	}
}

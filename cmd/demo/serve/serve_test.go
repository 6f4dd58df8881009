package serve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/internal/redistest"
)

// testConfig has a slow token bucket and a long sliding window, so the
// header values of a test's few requests do not depend on how fast the
// machine runs them.
const testConfig = `prefix: "hf:"
policies:
  - name: tb
    path: /api/tb
    algorithm: token_bucket
    capacity: 3
    refill_per_second: 0.1
    key: header:X-Client-ID
  - name: sw
    path: /api/sw
    algorithm: sliding_window
    limit: 2
    window: 10s
    key: header:X-Client-ID
`

// options returns serve options for a config holding src, against url.
func options(t testing.TB, url, src string) serve.Options {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return serve.Options{
		Listen: "127.0.0.1:0", Redis: url, Backend: "goredis", ID: "app1", Config: path,
		StateDir: t.TempDir(), ExpectedInstances: 1,
		// Generous: under -race on a busy machine a slow call would open the
		// breaker while Redis is healthy, which is another test.
		CallTimeout: 300 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
		Heartbeat: 200 * time.Millisecond, ShutdownTimeout: 5 * time.Second, LogFormat: "text",
	}
}

// syncBuffer is a log destination that tests read while the app writes.
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

func newApp(t testing.TB, o serve.Options) (*serve.App, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	a, err := serve.New(context.Background(), o, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, logs
}

// get sends GET path with X-Client-ID client ("" for none) to h.
func get(h http.Handler, path, client string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", path, nil)
	if client != "" {
		r.Header.Set("X-Client-ID", client)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestLimitedRoutesHeaders(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newApp(t, options(t, srv.URL(), testConfig))
	h := a.Handler()
	tests := []struct {
		path, code, policy, limit, retry, body string
	}{
		// Token bucket: capacity 3, one token every 10s; t is the time until
		// full (200) or until the next token (429).
		{"/api/tb", "200", `"tb";q=3;w=30`, `"tb";r=2;t=10`, "", `{"allowed":true,"remaining":2,"mode":"redis","policy":"tb"}`},
		{"/api/tb", "200", `"tb";q=3;w=30`, `"tb";r=1;t=20`, "", `{"allowed":true,"remaining":1,"mode":"redis","policy":"tb"}`},
		{"/api/tb", "200", `"tb";q=3;w=30`, `"tb";r=0;t=30`, "", `{"allowed":true,"remaining":0,"mode":"redis","policy":"tb"}`},
		{"/api/tb", "429", `"tb";q=3;w=30`, `"tb";r=0;t=10`, "10", `{"allowed":false,"remaining":0,"mode":"redis","retry_after_ms":10000,"policy":"tb"}`},
		// Sliding window: 2 per 10s.
		{"/api/sw", "200", `"sw";q=2;w=10`, `"sw";r=1;t=10`, "", `{"allowed":true,"remaining":1,"mode":"redis","policy":"sw"}`},
		{"/api/sw", "200", `"sw";q=2;w=10`, `"sw";r=0;t=10`, "", `{"allowed":true,"remaining":0,"mode":"redis","policy":"sw"}`},
		{"/api/sw", "429", `"sw";q=2;w=10`, `"sw";r=0;t=10`, "10", `{"allowed":false,"remaining":0,"mode":"redis","retry_after_ms":10000,"policy":"sw"}`},
	}
	// retry_after_ms counts from the request's own instant: the test
	// accepts 9000-10000 and compares the rest exactly.
	ms := regexp.MustCompile(`"retry_after_ms":(9\d\d\d|10000),`)
	for i, tt := range tests {
		w := get(h, tt.path, "client-42")
		body := ms.ReplaceAllString(strings.TrimSpace(w.Body.String()), `"retry_after_ms":10000,`)
		got := []string{strconv.Itoa(w.Code), w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), w.Header().Get("Retry-After"), body}
		want := []string{tt.code, tt.policy, tt.limit, tt.retry, tt.body}
		for j := range got {
			if got[j] != want[j] {
				t.Errorf("request %d %s: got %q, want %q", i+1, tt.path, got[j], want[j])
			}
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("request %d: Content-Type %q", i+1, ct)
		}
	}
	// Another client has its own quota.
	if w := get(h, "/api/tb", "client-43"); w.Code != 200 || w.Header().Get("RateLimit") != `"tb";r=2;t=10` {
		t.Errorf("second client: %d %s", w.Code, w.Header().Get("RateLimit"))
	}
}

func TestMissingKeyIs400(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newApp(t, options(t, srv.URL(), testConfig))
	w := get(a.Handler(), "/api/sw", "")
	if w.Code != 400 || strings.TrimSpace(w.Body.String()) != `{"error":"missing header X-Client-ID"}` {
		t.Errorf("no key: %d %s", w.Code, w.Body)
	}
	if w.Header().Get("RateLimit") != "" {
		t.Errorf("a request without a key carries RateLimit %q", w.Header().Get("RateLimit"))
	}
}

func TestOperatorRoutes(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newApp(t, options(t, srv.URL(), testConfig))
	h := a.Handler()
	get(h, "/api/tb", "very-secret-client-key")
	get(h, "/api/tb", "very-secret-client-key")
	for _, tt := range []struct{ path, want string }{
		{"/healthz", "ok\n"},
		{"/readyz", "ready\n"},
	} {
		if w := get(h, tt.path, ""); w.Code != 200 || w.Body.String() != tt.want {
			t.Errorf("%s: %d %q", tt.path, w.Code, w.Body)
		}
	}
	w := get(h, "/status", "")
	var st map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != 200 {
		t.Fatalf("/status: %d %s", w.Code, w.Body)
	}
	for _, k := range []string{"id", "breaker", "instances", "pending_log", "pending_refunds", "lost_refunds", "reconciles", "backend", "ready"} {
		if _, ok := st[k]; !ok {
			t.Errorf("/status lacks %q: %s", k, w.Body)
		}
	}
	if st["id"] != "app1" || st["breaker"] != "closed" || st["backend"] != "goredis" {
		t.Errorf("/status %s", w.Body)
	}
	m := get(h, "/metrics", "").Body.String()
	for _, want := range []string{
		`holdfast_decisions_total{mode="redis",policy="tb",result="allowed"} 2`,
		`holdfast_breaker_state{state="closed"} 1`,
		`holdfast_redis_call_duration_seconds_count{outcome="ok",script="token_bucket"}`,
		"holdfast_pending_log_grants 0",
		"holdfast_reconciles_total 0",
		"holdfast_last_reconcile_duration_seconds 0",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(m, "very-secret-client-key") || strings.Contains(m, srv.Addr()) {
		t.Error("/metrics shows a client key or the Redis address")
	}
	if w := httptest.NewRecorder(); true {
		h.ServeHTTP(w, httptest.NewRequest("POST", "/status", nil))
		if w.Code != http.StatusMethodNotAllowed {
			t.Errorf("POST /status: %d", w.Code)
		}
	}
}

// status reads /status.
func status(t *testing.T, h http.Handler) serve.Status {
	t.Helper()
	var st serve.Status
	if err := json.Unmarshal(get(h, "/status", "").Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStatusDuringOutage(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	a, logs := newApp(t, options(t, srv.URL(), testConfig))
	h := a.Handler()
	if w := get(h, "/api/tb", "c1"); w.Code != 200 {
		t.Fatalf("before the outage: %d", w.Code)
	}
	srv.Kill()
	// Requests go on: the first failures open the breaker, then leases
	// decide and log their grants.
	modes := map[string]int{}
	for i := range 6 {
		w := get(h, "/api/sw", "c"+strconv.Itoa(i))
		var b struct{ Mode string }
		json.Unmarshal(w.Body.Bytes(), &b)
		modes[b.Mode]++
		if w.Code != 200 {
			t.Errorf("request %d during the outage: %d %s", i, w.Code, w.Body)
		}
	}
	st := status(t, h)
	if st.Breaker != "open" || st.PendingLog == 0 || st.ID != "app1" || !st.Ready {
		t.Errorf("during the outage: %+v, want breaker open, pending_log > 0, ready", st)
	}
	if modes["local"] != 6 {
		t.Errorf("modes during the outage %v, want all local", modes)
	}
	if w := get(h, "/readyz", ""); w.Code != 200 {
		t.Errorf("/readyz during the outage: %d (degraded is still ready)", w.Code)
	}
	if m := get(h, "/metrics", "").Body.String(); !strings.Contains(m, `holdfast_breaker_state{state="open"} 1`) ||
		!strings.Contains(m, `holdfast_breaker_transitions_total{from="closed",to="open"} 1`) ||
		!strings.Contains(m, `holdfast_decisions_total{mode="local",policy="sw",result="allowed"} 6`) {
		t.Errorf("/metrics during the outage:\n%s", grep(m, "holdfast_"))
	}

	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for st = status(t, h); st.Breaker != "closed" || st.PendingLog != 0; st = status(t, h) {
		if time.Now().After(deadline) {
			t.Fatalf("10s after Redis returned: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Reconciles == 0 {
		t.Errorf("after recovery: %+v, want reconciles > 0", st)
	}
	for _, want := range []string{"msg=\"holdfast breaker\" instance=app1 from=closed to=open", "msg=\"holdfast reconciled\" instance=app1"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestConfigRejectionsStopTheStart(t *testing.T) {
	tb := func(field, line string) string {
		return strings.Replace(testConfig, field, line, 1)
	}
	tests := []struct {
		name, src string
		want      []string
	}{
		{"unknown field", tb("    capacity: 3\n", "    capacity: 3\n    burst: 5\n"), []string{`policy "tb"`, `unknown field "burst"`}},
		{"missing field", tb("    refill_per_second: 0.1\n", ""), []string{`policy "tb"`, "refill_per_second: required"}},
		{"bad number", tb("capacity: 3", "capacity: -3"), []string{`policy "tb"`, "capacity: must be a positive integer, got -3"}},
		{"bad duration", strings.Replace(testConfig, "window: 10s", "window: soon", 1), []string{`policy "sw"`, "window:"}},
		{"unknown algorithm", tb("algorithm: token_bucket", "algorithm: leaky"), []string{`policy "tb"`, `algorithm: unknown algorithm "leaky"`}},
		{"bad key source", tb("key: header:X-Client-ID", "key: body:id"), []string{`policy "tb"`, "key:"}},
		{"no path", tb("    path: /api/tb\n", ""), []string{`policy "tb": path: required by serve`}},
		{"no key", strings.Replace(testConfig, "    key: header:X-Client-ID\n", "", 2), []string{`policy "tb": key: required by serve`}},
		{"bad outage mode", tb("    key: header:X-Client-ID\n", "    key: header:X-Client-ID\n    outage: sometimes\n"), []string{`policy "tb"`, "outage:"}},
		{"shared path, another key", strings.Replace(strings.Replace(testConfig, "path: /api/sw", "path: /api/tb", 1), "window: 10s\n    key: header:X-Client-ID", "window: 10s\n    key: ip", 1), []string{`policy "sw"`, "key: differs"}},
		{"empty", "", []string{"policies:"}},
	}
	for _, tt := range tests {
		// No Redis is needed: the config is read before anything connects.
		o := options(t, "redis://127.0.0.1:1/0", tt.src)
		a, err := serve.New(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil {
			a.Close()
			t.Errorf("%s: started", tt.name)
			continue
		}
		msg := err.Error()
		for _, w := range append([]string{o.Config + ": config: "}, tt.want...) {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: error %q lacks %q", tt.name, msg, w)
			}
		}
	}
	// A missing file names it too.
	o := options(t, "redis://127.0.0.1:1/0", testConfig)
	o.Config += ".missing"
	if _, err := serve.New(context.Background(), o, slog.Default()); err == nil || !strings.Contains(err.Error(), o.Config) {
		t.Errorf("missing config: %v", err)
	}
}

// TestWrongPasswordAtStart: an instance whose password Redis refuses logs
// it as an error, starts anyway and limits locally (no 5xx, the policy's
// capacity admitted), with the reason in /status; once Redis accepts the
// password, it returns to Redis.
func TestWrongPasswordAtStart(t *testing.T) {
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithPassword("right"))
			o := options(t, "redis://:wrong@"+srv.Addr()+"/0", testConfig)
			o.Backend = backend
			a, logs := newApp(t, o)
			h := a.Handler()
			admitted := 0
			for i := range 5 {
				w := get(h, "/api/tb", "c1")
				switch w.Code {
				case 200:
					admitted++
				case 429:
				default:
					t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
				}
			}
			if admitted != 3 {
				t.Errorf("admitted %d of 5 with capacity 3", admitted)
			}
			st := status(t, h)
			if st.Breaker != "open" || st.LastError == nil || st.LastError.Reason != "WRONGPASS" {
				t.Errorf("status %+v (last error %+v), want open with reason WRONGPASS", st, st.LastError)
			}
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "WRONGPASS") {
				t.Errorf("the refused password was not logged as an error:\n%s", logs)
			}
			srv.Do(t, "CONFIG", "SET", "requirepass", "wrong")
			deadline := time.Now().Add(10 * time.Second)
			for st = status(t, h); st.Breaker != "closed" || st.PendingLog != 0; st = status(t, h) {
				if time.Now().After(deadline) {
					t.Fatalf("10 s after Redis took the password: %+v", st)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if w := get(h, "/api/tb", "c1"); w.Code != 429 || !strings.Contains(w.Body.String(), `"mode":"redis"`) {
				t.Errorf("after recovery: %d %s, want a Redis denial: the 3 local grants were replayed", w.Code, w.Body)
			}
		})
	}
}

package serve_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/internal/redistest"
)

// TestAdmin: the operator's API unblocks a client (POST /admin/reset gives
// the bucket of 3 back) and tells what a request would get without
// spending (GET /admin/peek), with clear errors for a missing or unknown
// policy, a missing key and a bad cost. Policies sharing a path are
// charged together: /api/both admits 2 (the window's limit), and the
// bucket behind it is not spent by the denials.
func TestAdmin(t *testing.T) {
	srv := redistest.Start(t)
	src := testConfig + `  - name: both_tb
    path: /api/both
    algorithm: token_bucket
    capacity: 5
    refill_per_second: 0.01
    key: header:X-Client-ID
  - name: both_sw
    path: /api/both
    algorithm: sliding_window
    limit: 2
    window: 1m
    key: header:X-Client-ID
`
	a, _ := newApp(t, options(t, srv.URL(), src))
	h, admin := a.Handler(), a.AdminHandler()
	do := func(method, target string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, httptest.NewRequest(method, target, nil))
		return w
	}
	peek := func(target string) serve.PeekBody {
		t.Helper()
		w := do("GET", target)
		var b serve.PeekBody
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &b) != nil {
			t.Fatalf("GET %s: %d %s", target, w.Code, w.Body)
		}
		return b
	}
	for i, want := range []int{200, 200, 200, 429} {
		if w := get(h, "/api/tb", "c1"); w.Code != want {
			t.Fatalf("request %d: %d, want %d", i+1, w.Code, want)
		}
	}
	if b := peek("/admin/peek?policy=tb&key=c1"); b.Allowed || b.Remaining != 0 || b.Limit != 3 || b.Mode != "redis" || b.RetryAfterMS < 9000 {
		t.Fatalf("peek of a drained bucket: %+v", b)
	}
	if w := do("POST", "/admin/reset?policy=tb&key=c1"); w.Code != http.StatusNoContent {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	if b := peek("/admin/peek?policy=tb&key=c1&cost=3"); !b.Allowed || b.Remaining != 0 {
		t.Fatalf("peek of 3 after the reset: %+v, want a full bucket", b)
	}
	for i := range 3 {
		if w := get(h, "/api/tb", "c1"); w.Code != 200 {
			t.Fatalf("request %d after the reset: %d", i+1, w.Code)
		}
	}
	for _, tc := range []struct {
		method, target string
		code           int
	}{
		{"POST", "/admin/reset?key=c1", 400},
		{"POST", "/admin/reset?policy=tb", 400},
		{"POST", "/admin/reset?policy=nope&key=c1", 404},
		{"GET", "/admin/peek?policy=tb&key=c1&cost=0", 400},
		{"GET", "/admin/peek?policy=tb&key=c1&cost=4", 400}, // above the capacity
		{"GET", "/admin/reset?policy=tb&key=c1", 405},
	} {
		if w := do(tc.method, tc.target); w.Code != tc.code {
			t.Errorf("%s %s: %d %q, want %d", tc.method, tc.target, w.Code, w.Body, tc.code)
		}
	}
	// Two policies on one path: the window (2) denies the third, and the
	// bucket (5) keeps 3.
	for i, want := range []int{200, 200, 429, 429, 429} {
		if w := get(h, "/api/both", "c2"); w.Code != want {
			t.Fatalf("/api/both request %d: %d, want %d", i+1, w.Code, want)
		}
	}
	if b := peek("/admin/peek?policy=both_tb&key=c2&cost=3"); !b.Allowed || b.Remaining != 0 {
		t.Fatalf("the bucket behind /api/both: %+v, want 3 left (spent by the 2 admitted only)", b)
	}
}

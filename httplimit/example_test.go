package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/httplimit"
)

// A route limited to a burst of 2 requests per client, refilled at one a
// second: the third request in a burst is turned away with 429.
func Example() {
	// A fixed clock keeps the output stable; omit Clock in a service.
	now := time.Unix(1_700_000_000, 0)
	store, _ := memory.New(memory.Options{Clock: func() time.Time { return now }}) // or a Redis store, wrapped in fallback.New
	defer store.Close()
	limiter, _ := core.NewLimiter(store, core.Options{})

	policy, _ := tokenbucket.Policy("api", 2, 1)
	mux := http.NewServeMux()
	rule := httplimit.Rule{Policy: policy, Key: httplimit.Header("X-Client-ID")}
	mux.Handle("/api", httplimit.New(limiter, rule)(http.HandlerFunc(httplimit.AllowedJSON)))

	for range 3 {
		r := httptest.NewRequest("GET", "/api", nil)
		r.Header.Set("X-Client-ID", "client-42")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit-Policy: %s RateLimit: %s", w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Print(" Retry-After: ", ra)
		}
		fmt.Println()
		fmt.Print("  ", w.Body)
	}
	r := httptest.NewRequest("GET", "/api", nil) // no X-Client-ID
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	fmt.Println(w.Code)
	fmt.Print("  ", w.Body)
	// Output:
	// 200 RateLimit-Policy: "api";q=2;w=2 RateLimit: "api";r=1;t=1
	//   {"allowed":true,"remaining":1,"mode":"local","policy":"api"}
	// 200 RateLimit-Policy: "api";q=2;w=2 RateLimit: "api";r=0;t=2
	//   {"allowed":true,"remaining":0,"mode":"local","policy":"api"}
	// 429 RateLimit-Policy: "api";q=2;w=2 RateLimit: "api";r=0;t=1 Retry-After: 1
	//   {"allowed":false,"remaining":0,"mode":"local","retry_after_ms":1000,"policy":"api"}
	// 400
	//   {"error":"missing header X-Client-ID"}
}

// A route keyed by the API key in "Authorization: Bearer KEY", where a
// POST costs 2 and CORS preflights (OPTIONS) are free, with a bucket of 4
// refilled at one a second.
func Example_rule() {
	now := time.Unix(1_700_000_000, 0)
	store, _ := memory.New(memory.Options{Clock: func() time.Time { return now }})
	defer store.Close()
	limiter, _ := core.NewLimiter(store, core.Options{})
	policy, _ := tokenbucket.Policy("api", 4, 1)

	rule := httplimit.Rule{
		Policy: policy,
		Key: func(r *http.Request) (string, error) {
			key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || key == "" {
				return "", &httplimit.ClientError{Reason: "missing bearer token"}
			}
			return key, nil
		},
		Cost: func(r *http.Request) (int64, error) {
			if r.Method == http.MethodPost {
				return 2, nil
			}
			return 1, nil
		},
		Exempt: func(r *http.Request) bool { return r.Method == http.MethodOptions },
	}
	h := httplimit.New(limiter, rule)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))

	for _, method := range []string{"GET", "POST", "OPTIONS", "POST", "GET", "GET"} {
		r := httptest.NewRequest(method, "/api", nil)
		r.Header.Set("Authorization", "Bearer key-7")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		rl := w.Header().Get("RateLimit")
		if rl == "" {
			rl = "(none: exempt)"
		}
		fmt.Printf("%-7s %d RateLimit: %s\n", method, w.Code, rl)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/api", nil))
	fmt.Print("no key  ", w.Code, " ", w.Body)
	// Output:
	// GET     200 RateLimit: "api";r=3;t=1
	// POST    200 RateLimit: "api";r=1;t=3
	// OPTIONS 200 RateLimit: (none: exempt)
	// POST    429 RateLimit: "api";r=1;t=1
	// GET     200 RateLimit: "api";r=0;t=4
	// GET     429 RateLimit: "api";r=0;t=1
	// no key  400 {"error":"missing bearer token"}
}

// Behind one proxy that appends to X-Forwarded-For, the client is the last
// address: what the client wrote itself does not count. IPv6 clients are
// keyed by their /64.
func ExampleClientIP() {
	key := httplimit.ClientIP(httplimit.IPOptions{TrustedProxies: 1})
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.2:41000" // the proxy
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 2001:db8:1:2::77")
	k, _ := key(r)
	fmt.Println(k)
	r.Header.Set("X-Forwarded-For", "203.0.113.7")
	k, _ = key(r)
	fmt.Println(k)
	// Output:
	// 2001:db8:1:2::/64
	// 203.0.113.7
}

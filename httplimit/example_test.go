package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/config"
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
	key, _ := config.ParseKeySource("header:X-Client-ID")
	mux := http.NewServeMux()
	mux.Handle("/api", httplimit.New(limiter, httplimit.Rule{Policy: policy, Key: key})(http.HandlerFunc(httplimit.AllowedJSON)))

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

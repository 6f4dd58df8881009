package metrics_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/metrics"
)

// Decisions counted by policy, result and mode, scraped from Handler. With
// a Redis store, wrap the store too (Store) before fallback.New, pass
// BreakerChange as the breaker's OnStateChange and Watch the limiter's
// Status.
func Example() {
	m := metrics.New()
	store, _ := memory.New(memory.Options{})
	defer store.Close()
	lim, _ := core.NewLimiter(m.Store(store), core.Options{})
	counted := m.Limiter(lim)
	policy, _ := tokenbucket.Policy("api", 2, 0.01)
	for range 3 {
		counted.AllowN(context.Background(), policy, "client-42", 1)
	}

	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(w.Body.String(), "\n") {
		if strings.HasPrefix(line, "holdfast_decisions_total") {
			fmt.Println(line)
		}
	}
	// Output:
	// holdfast_decisions_total{mode="local",policy="api",result="allowed"} 2
	// holdfast_decisions_total{mode="local",policy="api",result="denied"} 1
}

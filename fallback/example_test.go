package fallback_test

import (
	"context"
	"fmt"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/fallback"
)

// A fallback limiter's life: New over a store (here one in this process;
// in a service, goredis.New or rueidis.New: see backend/goredis's
// Example), Start, decisions, Status, Close. Its decisions say where they
// were made; while Redis cannot decide they are local (Result.Degraded)
// and folded back into Redis when it returns.
func Example() {
	store, _ := memory.New(memory.Options{})
	defer store.Close()
	limiter, err := fallback.New(store, fallback.Options{ID: "example", Service: "api"})
	if err != nil {
		panic(err)
	}
	if err := limiter.Start(context.Background()); err != nil {
		panic(err)
	}
	defer limiter.Close()

	policy, _ := tokenbucket.Policy("api", 2, 0.01) // 2 requests, then one every 100 s
	for i := 1; i <= 3; i++ {
		r, err := limiter.Allow(context.Background(), policy, "client-42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed=%v remaining=%d degraded=%v\n", i, r.Allowed, r.Remaining, r.Degraded)
	}
	st := limiter.Status()
	fmt.Println("breaker:", st.Breaker, "instances:", st.Instances, "pending log:", st.PendingLog)
	// Output:
	// request 1: allowed=true remaining=1 degraded=false
	// request 2: allowed=true remaining=0 degraded=false
	// request 3: allowed=false remaining=0 degraded=false
	// breaker: closed instances: 1 pending log: 0
}

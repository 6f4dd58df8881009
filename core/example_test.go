package core_test

import (
	"context"
	"fmt"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
)

// A token bucket of 3 requests, refilled at one per second: the fourth
// request in a burst is denied and told when to retry.
func Example() {
	store, _ := memory.New(memory.Options{}) // or goredis.New / rueidis.New for a shared limit
	defer store.Close()
	limiter, _ := core.NewLimiter(store, core.Options{})
	policy, _ := tokenbucket.Policy("api", 3, 1)

	for i := 1; i <= 4; i++ {
		r, err := limiter.Allow(context.Background(), policy, "client-42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed=%v remaining=%d retry_after<=1s=%v\n", i, r.Allowed, r.Remaining, r.RetryAfter <= 1e9)
	}
	// Output:
	// request 1: allowed=true remaining=2 retry_after<=1s=true
	// request 2: allowed=true remaining=1 retry_after<=1s=true
	// request 3: allowed=true remaining=0 retry_after<=1s=true
	// request 4: allowed=false remaining=0 retry_after<=1s=true
}

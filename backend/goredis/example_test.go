package goredis_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// redisURL is the Redis the examples use; TestMain points it at a
// redis-server of the test's own.
var redisURL = "redis://127.0.0.1:6379/0"

func TestMain(m *testing.M) {
	srv, stop, err := redistest.StartMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisURL = srv.URL()
	code := m.Run()
	stop()
	os.Exit(code)
}

// A limit shared by every instance through Redis, which keeps holding
// when Redis fails: a go-redis client with a limiter's deadlines, the
// store on it, and the fallback limiter over the store.
func Example() {
	client, err := goredis.NewClient(redisURL, goredis.ClientOptions{})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	limiter, err := fallback.New(goredis.New(client), fallback.Options{ID: "example-1", Service: "api"})
	if err != nil {
		panic(err)
	}
	if err := limiter.Start(context.Background()); err != nil {
		panic(err)
	}
	defer limiter.Close()

	policy, _ := tokenbucket.Policy("goredis-example", 2, 1) // 2 requests, then 1 a second
	for i := 1; i <= 3; i++ {
		r, err := limiter.Allow(context.Background(), policy, "client-42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed=%v remaining=%d mode=%v\n", i, r.Allowed, r.Remaining, r.Mode)
	}
	// Output:
	// request 1: allowed=true remaining=1 mode=redis
	// request 2: allowed=true remaining=0 mode=redis
	// request 3: allowed=false remaining=0 mode=redis
}

// An application's own client, shared with the rest of the service: taken
// once its options keep the limiter's deadline.
func ExampleFromClient() {
	client, err := goredis.NewClient(redisURL, goredis.ClientOptions{PoolSize: 20})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	if _, err := goredis.FromClient(client); err != nil {
		panic(err)
	}
	fmt.Println("accepted")
	// Output: accepted
}

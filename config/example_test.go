package config_test

import (
	"fmt"
	"strings"

	"github.com/holdfast/holdfast/config"
)

// A config of two policies: each is validated as it loads, and a service
// looks its policies up by name. A token bucket prints as its capacity and
// the time to refill one token (20 per 200ms: 5 a second).
func ExampleLoad() {
	cfg, err := config.Load(strings.NewReader(`
prefix: "hf:"
policies:
  - name: api
    path: /api
    algorithm: token_bucket
    capacity: 20
    refill_per_second: 5
    key: header:X-Client-ID
  - name: login
    path: /login
    algorithm: sliding_window
    limit: 5
    window: 1m
    key: ip
    outage: fail_closed
`))
	if err != nil {
		panic(err)
	}
	for _, p := range cfg.Policies {
		fmt.Printf("%s on %s: %v, outage %v\n", p.Name, p.Path, p.Policy, p.Outage)
	}
	_, err = cfg.Registry().Lookup("admin")
	fmt.Println(err)
	// Output:
	// api on /api: api(token_bucket 20 per 200ms), outage leases
	// login on /login: login(sliding_window 5 per 1m0s), outage fail_closed
	// core: unknown policy: no policy named "admin"
}

// A config error names the policy and the field.
func ExampleLoad_error() {
	_, err := config.Load(strings.NewReader(`
policies:
  - name: api
    path: /api
    algorithm: token_bucket
    capacity: 0
    refill_per_second: 5
    key: header:X-Client-ID
`))
	fmt.Println(err)
	// Output: config: policy "api": capacity: must be a positive integer, got 0
}

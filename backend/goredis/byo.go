package goredis

import (
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// FromClient returns a Store on a client the application built itself (its
// own pool, shared with the rest of the service), once CheckClient finds
// nothing in its options that would break a limiter's deadline. NewClient
// builds a client that passes.
func FromClient(c redis.UniversalClient) (*Store, error) {
	if err := CheckClient(c); err != nil {
		return nil, err
	}
	return New(c), nil
}

// CheckClient reports what in c's options would let a limiter's call
// outlive its context deadline or reach Redis twice, naming the option to
// change. A limiter needs:
//   - no retries (MaxRetries -1): a script re-sent after a network error
//     may spend quota twice, and each retry adds its backoff to the wait;
//   - context deadlines honoured on the socket (ContextTimeoutEnabled
//     true): otherwise go-redis waits out ReadTimeout, 3 s by default,
//     whatever the call's 50 ms deadline;
//   - on Redis Cluster, at most one redirect (MaxRedirects 1), which a
//     failover needs and which is also the one re-send after a network
//     error that go-redis allows a cluster call.
//
// The other options (pool size, socket timeouts, TLS, credentials) are the
// application's; short socket timeouts help a dead Redis fail fast but are
// not required once context deadlines are honoured. Only *redis.Client
// (single node or Sentinel failover) and *redis.ClusterClient are
// supported.
func CheckClient(c redis.UniversalClient) error {
	var retries, redirects int
	var ctxTimeout bool
	switch cc := c.(type) {
	case nil:
		return errors.New("goredis: nil client")
	case *redis.Client:
		o := cc.Options()
		retries, ctxTimeout = o.MaxRetries, o.ContextTimeoutEnabled
	case *redis.ClusterClient:
		o := cc.Options()
		retries, ctxTimeout, redirects = o.MaxRetries, o.ContextTimeoutEnabled, o.MaxRedirects
		if redirects > 1 {
			return fmt.Errorf("goredis: the cluster client follows up to %d redirects or network retries per call (MaxRedirects; 0 means 3): a script may reach Redis twice and outlive its deadline; set MaxRedirects: 1", redirects)
		}
	default:
		return fmt.Errorf("goredis: a %T is not supported: use a *redis.Client (single node, Sentinel) or a *redis.ClusterClient", c)
	}
	if retries > 0 {
		return fmt.Errorf("goredis: the client retries a failed command up to %d times (MaxRetries; 0 means 3 on a single node): a script re-sent after a network error may spend quota twice and outlive its deadline; set MaxRetries: -1", retries)
	}
	if !ctxTimeout {
		return errors.New("goredis: the client ignores context deadlines on its sockets (ContextTimeoutEnabled false) and waits out ReadTimeout instead, 3 s by default: set ContextTimeoutEnabled: true")
	}
	return nil
}

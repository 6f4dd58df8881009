package goredis_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/backend/goredis"
)

// TestFromClient: an application's own client is taken when it keeps a
// limiter's deadline, and refused with the option to change when not.
func TestFromClient(t *testing.T) {
	good, err := goredis.NewClient("redis://127.0.0.1:1/0", goredis.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	goodCluster, err := goredis.NewClient("redis://127.0.0.1:1?addr=127.0.0.1:2", goredis.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    redis.UniversalClient
		want string // "" accepted; else a part of the error
	}{
		{"NewClient", good, ""},
		{"NewClient cluster", goodCluster, ""},
		{"own client, tuned", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true}), ""},
		{"go-redis defaults retry", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), "set MaxRetries: -1"},
		{"retries", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: 2, ContextTimeoutEnabled: true}), "up to 2 times"},
		{"deadlines ignored", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}), "set ContextTimeoutEnabled: true"},
		{"cluster defaults redirect 3 times", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), "set MaxRedirects: 1"},
		{"cluster tuned", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRedirects: 1, ContextTimeoutEnabled: true}), ""},
		{"ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), "not supported"},
		{"nil", nil, "nil client"},
	} {
		s, err := goredis.FromClient(tc.c)
		switch {
		case tc.want == "" && (err != nil || s == nil):
			t.Errorf("%s: %v, want accepted", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		if tc.c != nil {
			tc.c.Close()
		}
	}
}

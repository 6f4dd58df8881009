package goredis_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/backend/goredis"
)

func TestNewClientOptions(t *testing.T) {
	for _, tc := range []struct {
		url        string
		o          goredis.ClientOptions
		read, dial time.Duration
	}{
		{"redis://127.0.0.1:6379/0", goredis.ClientOptions{}, goredis.DefaultReadTimeout, goredis.DefaultDialTimeout},
		{"redis://127.0.0.1:6379/0?read_timeout=200ms", goredis.ClientOptions{}, 200 * time.Millisecond, goredis.DefaultDialTimeout},
		{"redis://127.0.0.1:6379/0?read_timeout=200ms", goredis.ClientOptions{ReadTimeout: time.Second, DialTimeout: time.Second}, time.Second, time.Second},
	} {
		c, err := goredis.NewClient(tc.url, tc.o)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		o := c.(*redis.Client).Options()
		c.Close()
		// go-redis normalises MaxRetries -1 (no retries) to 0 in a client.
		if o.ReadTimeout != tc.read || o.DialTimeout != tc.dial || o.MaxRetries != 0 || !o.ContextTimeoutEnabled || o.DialerRetries != 1 {
			t.Errorf("%s %+v: read %v dial %v retries %d dialer retries %d ctx %v",
				tc.url, tc.o, o.ReadTimeout, o.DialTimeout, o.MaxRetries, o.DialerRetries, o.ContextTimeoutEnabled)
		}
	}
}

func TestNewClientCluster(t *testing.T) {
	for _, tc := range []struct {
		url string
		o   goredis.ClientOptions
	}{
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", goredis.ClientOptions{}},
		{"redis://127.0.0.1:7000", goredis.ClientOptions{Cluster: true}},
	} {
		c, err := goredis.NewClient(tc.url, tc.o)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		cc, ok := c.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("%s: got %T, want a cluster client", tc.url, c)
		}
		o := cc.Options()
		if o.ReadTimeout != goredis.DefaultReadTimeout || o.MaxRetries != -1 || !o.ContextTimeoutEnabled {
			t.Errorf("%s: read %v retries %d ctx %v", tc.url, o.ReadTimeout, o.MaxRetries, o.ContextTimeoutEnabled)
		}
		c.Close()
	}
}

func TestNewClientErrors(t *testing.T) {
	for _, tc := range []struct {
		url string
		o   goredis.ClientOptions
	}{
		{"http://127.0.0.1:6379", goredis.ClientOptions{}},
		{"redis://127.0.0.1:6379/x", goredis.ClientOptions{}},
		{"redis://127.0.0.1:6379", goredis.ClientOptions{ReadTimeout: -1}},
		{"redis://127.0.0.1:6379", goredis.ClientOptions{PoolSize: -1}},
		{"::", goredis.ClientOptions{}},
	} {
		if c, err := goredis.NewClient(tc.url, tc.o); err == nil {
			c.Close()
			t.Errorf("%q %+v: no error", tc.url, tc.o)
		}
	}
}

// TestURLErrorsHideSecrets: a malformed URL's error names the problem but
// never the password.
func TestURLErrorsHideSecrets(t *testing.T) {
	for _, u := range []string{"redis://:sekrit@127.0.0.1:bad/0", "rediss://user:sekrit@[::1", "redis://u:sekrit@h:1/zz"} {
		_, err := goredis.NewClient(u, goredis.ClientOptions{})
		if err == nil || strings.Contains(err.Error(), "sekrit") {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestClientLogsThroughLogger: go-redis's own lines about a Redis that is
// down ("failed to dial") go to ClientOptions.Logger at level Debug, not
// to stderr.
func TestClientLogsThroughLogger(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := goredis.NewClient("redis://"+addr+"/0", goredis.ClientOptions{Logger: logger, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		c.Ping(context.Background())
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		if strings.Contains(out, "level=DEBUG") && strings.Contains(out, "go-redis: ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no go-redis line reached the logger: %q", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

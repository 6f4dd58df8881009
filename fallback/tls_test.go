package fallback_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

func tlsStore(t *testing.T, backend, url string, cfg *tls.Config) driver.Store {
	t.Helper()
	switch backend {
	case "goredis":
		c, err := goredis.NewClient(url, goredis.ClientOptions{TLS: cfg, ReadTimeout: callTimeout, WriteTimeout: callTimeout, DialTimeout: callTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	default:
		c, err := rueidis.NewClient(url, rueidis.ClientOptions{TLS: cfg, DialTimeout: callTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return rueidis.New(c)
	}
}

// TestTLS: rediss:// to redis-server's TLS port with a CA the test made:
// decisions go through Redis; with a certificate from another CA the call
// fails at once with a certificate error (ErrStoreUnavailable), no hang.
func TestTLS(t *testing.T) {
	t.Parallel()
	files := redistest.NewTLS(t)
	other := redistest.NewTLS(t)
	srv := redistest.Start(t, redistest.WithTLS(files))
	if !strings.HasPrefix(srv.URL(), "rediss://") {
		t.Fatalf("URL %s", srv.URL())
	}
	p, _ := tokenbucket.Policy("tls", 2, 0.001)
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			l, _ := core.NewLimiter(tlsStore(t, backend, srv.URL(), &tls.Config{RootCAs: files.Pool}), core.Options{})
			for i := range 3 {
				r, err := l.Allow(ctx, p, backend)
				if err != nil || r.Allowed != (i < 2) || r.Mode != core.ModeRedis {
					t.Fatalf("request %d over TLS: %+v %v", i, r, err)
				}
			}
			bad, _ := core.NewLimiter(tlsStore(t, backend, srv.URL(), &tls.Config{RootCAs: other.Pool}), core.Options{})
			start := time.Now()
			_, err := bad.Allow(ctx, p, backend+"-bad")
			took := time.Since(start)
			if !errors.Is(err, core.ErrStoreUnavailable) || !strings.Contains(err.Error(), "certificate") {
				t.Fatalf("untrusted certificate: %v, want ErrStoreUnavailable naming the certificate", err)
			}
			if took > 2*time.Second {
				t.Fatalf("the certificate error took %v", took)
			}
			t.Logf("untrusted certificate reported in %v: %v", took.Round(time.Millisecond), err)
			note("TLS (TestTLS)", fmt.Sprintf("%s: 3 decisions over rediss:// with a test CA (2 admitted, the third denied, as the policy says); a server certificate from another CA fails in %v with ErrStoreUnavailable naming the certificate",
				backend, took.Round(time.Millisecond)))
		})
	}
}

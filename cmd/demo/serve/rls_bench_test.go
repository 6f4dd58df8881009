package serve_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/holdfast/holdfast/internal/redistest"
)

// benchStreams is how many calls are in flight at once.
const benchStreams = 64

// The same limit both ways: a token bucket per client of a million a
// second, so that every decision goes through Redis and admits.
const (
	benchHTTPConfig = `policies:
  - name: bench
    path: /api/bench
    algorithm: token_bucket
    capacity: 1000000
    refill_per_second: 1000000
    key: header:X-Client-ID
`
	benchRLSConfig = `domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000}
`
)

// BenchmarkDecisions measures one serve instance's decisions through
// Redis (goredis) with 64 calls in flight, each of the 64 callers its own
// client key: ShouldRateLimit through the rate limit service (one gRPC
// connection, 64 concurrent streams, as Envoy calls it) against GET of a
// limited route (64 keep-alive connections). It reports decisions/s and
// the p99 latency of a call in µs.
//
//	go test -run '^$' -bench Decisions -benchtime 20000x ./cmd/demo/serve
func BenchmarkDecisions(b *testing.B) {
	srv := redistest.Start(b)
	o := rlsOptions(b, srv.URL(), benchRLSConfig)
	o.Config = filepath.Join(b.TempDir(), "policies.yaml")
	if err := os.WriteFile(o.Config, []byte(benchHTTPConfig), 0o644); err != nil {
		b.Fatal(err)
	}
	a, _ := newApp(b, o)
	rl := rlsv3.NewRateLimitServiceClient(serveRLS(b, a))
	hs := httptest.NewServer(a.Handler())
	defer hs.Close()
	b.Run("rls-grpc", func(b *testing.B) {
		parallel(b, func(i int) error {
			r, err := rl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", fmt.Sprint("g", i))}})
			if err == nil && r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				err = fmt.Errorf("code %v", r.GetOverallCode())
			}
			return err
		})
	})
	b.Run("http", func(b *testing.B) {
		tr := &http.Transport{MaxIdleConnsPerHost: benchStreams, MaxConnsPerHost: benchStreams}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		parallel(b, func(i int) error {
			req, _ := http.NewRequest("GET", hs.URL+"/api/bench", nil)
			req.Header.Set("X-Client-ID", fmt.Sprint("h", i))
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		})
	})
}

// parallel runs b.N calls of call from benchStreams goroutines (call's
// argument is the goroutine's number) and reports decisions/s and the
// p99 of a call's latency.
func parallel(b *testing.B, call func(i int) error) {
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
		next = make(chan struct{}, benchStreams)
	)
	go func() {
		for range b.N {
			next <- struct{}{}
		}
		close(next)
	}()
	b.ResetTimer()
	start := time.Now()
	for i := range benchStreams {
		wg.Go(func() {
			var mine []time.Duration
			for range next {
				t0 := time.Now()
				if err := call(i); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	slices.Sort(lats)
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
	}
	b.ReportMetric(float64(len(lats))/took.Seconds(), "decisions/s")
}

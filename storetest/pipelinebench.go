package storetest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// scriptReconcile has the shape of a reconciliation: write a hash, set its
// expiry.
var scriptReconcile = driver.NewScript("reconcile", `
redis.call('HSET', KEYS[1], 'n', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1}`, nil)

// benchCalls is the size of a benchmark batch.
const benchCalls = 100_000

// reconcileCalls returns benchCalls calls of scriptReconcile on distinct
// keys.
func reconcileCalls() []driver.Call {
	calls := make([]driver.Call, benchCalls)
	for i := range calls {
		calls[i] = driver.Call{Script: scriptReconcile, Keys: []string{fmt.Sprintf("{bench:%d}:h", i)}, Args: []string{strconv.Itoa(i), "60000"}}
	}
	return calls
}

// warmUp runs calls once, so that every sub-benchmark finds the keys
// created and the script cached: the first sub-benchmark is not charged for
// them.
func warmUp(b *testing.B, s driver.Pipeliner, calls []driver.Call) {
	for i, r := range s.RunMany(context.Background(), calls) {
		if r.Err != nil {
			b.Logf("warm-up, call %d: %v", i, r.Err)
			return
		}
	}
}

// pipelineSizings are the RunMany sizings the benchmarks compare: the
// default (zero), smaller chunks, and larger ones on one connection and on
// four.
var pipelineSizings = []struct{ chunk, workers int }{{0, 0}, {100, 4}, {1000, 1}, {1000, 4}}

// sizingName names the sub-benchmark of a sizing; chunk 0 is the default.
func sizingName(chunk, workers int) string {
	if chunk == 0 {
		return "RunMany"
	}
	return fmt.Sprintf("RunMany/chunk=%d,workers=%d", chunk, workers)
}

// BenchRunMany measures one batch of 100k reconciliation-shaped calls on
// distinct keys, with the default client options: RunMany with the default
// pipeline sizing and others, and the same calls as concurrent Run calls
// from 256 goroutines. One op is the whole batch. failed/op counts calls
// that failed (a deadline), which a sizing must not cause.
func BenchRunMany(b *testing.B, h RedisHarness) {
	const goroutines = 256
	srv := redistest.Start(b)
	s := h.NewStore(b, srv.URL(), StoreOptions{})
	calls := reconcileCalls()
	warmUp(b, s, calls)
	srv.Do(b, "CONFIG", "RESETSTAT")
	report := func(b *testing.B, failed int64, first error) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchCalls), "ns/call")
		b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
		if first != nil {
			b.Logf("%d calls failed; first: %v", failed, first)
		}
		b.Logf("server: %s", evalshaStats(srv.Do(b, "INFO", "commandstats")))
		srv.Do(b, "CONFIG", "RESETSTAT")
	}
	for _, sz := range pipelineSizings {
		b.Run(sizingName(sz.chunk, sz.workers), func(b *testing.B) {
			if sz.chunk > 0 {
				defer h.SetPipelineSizing(sz.chunk, sz.workers)()
			}
			var failed int64
			var first error
			for b.Loop() {
				for _, r := range s.RunMany(context.Background(), calls) {
					if r.Err != nil {
						failed++
						first = cmp.Or(first, r.Err)
					}
				}
			}
			report(b, failed, first)
		})
	}
	b.Run(fmt.Sprintf("Run/goroutines=%d", goroutines), func(b *testing.B) {
		var failed atomic.Int64
		var first atomic.Pointer[error]
		for b.Loop() {
			var next atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < benchCalls; i = next.Add(1) - 1 {
						c := calls[i]
						if _, err := s.Run(context.Background(), c.Script, c.Keys, c.Args); err != nil {
							failed.Add(1)
							first.CompareAndSwap(nil, &err)
						}
					}
				})
			}
			wg.Wait()
		}
		var err error
		if p := first.Load(); p != nil {
			err = *p
		}
		report(b, failed.Load(), err)
	})
}

// BenchRunManyLiveLatency measures what a batch does to live traffic: the
// latency of sequential Run calls on the same store while RunMany runs 100k
// calls, for each sizing. It reports the median and 99th percentile.
func BenchRunManyLiveLatency(b *testing.B, h RedisHarness) {
	s := h.NewStore(b, redistest.Start(b).URL(), StoreOptions{})
	calls := reconcileCalls()
	warmUp(b, s, calls)
	for _, sz := range pipelineSizings {
		b.Run(sizingName(sz.chunk, sz.workers), func(b *testing.B) {
			if sz.chunk > 0 {
				defer h.SetPipelineSizing(sz.chunk, sz.workers)()
			}
			var lat []time.Duration
			var failed int
			for b.Loop() {
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						if _, err := s.Run(context.Background(), scriptInts, []string{"{live}:k"}, []string{"1"}); err != nil {
							failed++
						}
						lat = append(lat, time.Since(start))
					}
				}()
				s.RunMany(context.Background(), calls)
				close(stop)
				<-done
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
			b.ReportMetric(q(0.5), "live-p50-µs")
			b.ReportMetric(q(0.99), "live-p99-µs")
			b.ReportMetric(float64(failed)/float64(b.N), "live-failed/op")
		})
	}
}

// evalshaStats picks the EVALSHA line out of INFO commandstats.
func evalshaStats(info string) string {
	for line := range strings.Lines(info) {
		if strings.HasPrefix(line, "cmdstat_evalsha:") {
			return strings.TrimSpace(line)
		}
	}
	return "no EVALSHA stats"
}

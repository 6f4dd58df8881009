package fallback_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

// instantStore answers every decision at once with an admission, as a
// Redis with no round trip would: what a decision costs on top of the
// store is all that is left to measure.
type instantStore struct{}

func (instantStore) Run(_ context.Context, _ *driver.Script, _ []string, args []string) ([]int64, error) {
	return []int64{1, 999_999, 0, 1, time.Now().UnixMicro()}, nil
}

// BenchmarkRemoteOverhead measures what a decision through the store costs
// the client beside the store's call: core.Limiter's path, and
// fallback.Limiter's with the breaker closed (the breaker, the call
// deadline and the known state it keeps for leases), on one hot key and
// on 100k keys.
func BenchmarkRemoteOverhead(b *testing.B) {
	p, _ := tokenbucket.Policy("bench", 1_000_000, 1_000_000)
	fl, err := fallback.New(instantStore{}, fallback.Options{
		ID: "bench", ExpectedInstances: 4,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	fl.MarkStarted()
	defer fl.Close()
	cl, err := core.NewLimiter(instantStore{}, core.Options{})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	ctx := context.Background()
	for _, lim := range []struct {
		name  string
		allow func(context.Context, core.Policy, string) (core.Result, error)
	}{{"core", cl.Allow}, {"fallback", fl.Allow}} {
		for _, bc := range []struct {
			name string
			keys []string
		}{{"hot_key", keys[:1]}, {"100k_keys", keys}} {
			b.Run(lim.name+"/"+bc.name, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					r, err := lim.allow(ctx, p, bc.keys[i%len(bc.keys)])
					if err != nil || !r.Allowed || r.Degraded {
						b.Fatalf("%+v %v", r, err)
					}
					i++
				}
			})
		}
	}
}

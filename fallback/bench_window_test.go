package fallback_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/fallback"
)

// BenchmarkLocalDecisionWindow is BenchmarkLocalDecision for a sliding
// window: the lease's weighted log and the logged grants with their ids.
func BenchmarkLocalDecisionWindow(b *testing.B) {
	l, err := fallback.New(downStore{}, fallback.Options{
		ID: "bench", ExpectedInstances: 4,
		Breaker: fallback.BreakerOptions{Start: fallback.Open},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p, _ := slidingwindow.Policy("bench", 1_000_000, time.Millisecond) // windows pass quickly: the lease stays small
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	for _, bc := range []struct {
		name string
		keys []string
	}{{"hot_key", keys[:1]}, {"100k_keys", keys}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			i := 0
			for b.Loop() {
				r, err := l.Allow(ctx, p, bc.keys[i%len(bc.keys)])
				if err != nil || !r.Degraded {
					b.Fatalf("%+v %v", r, err)
				}
				i++
			}
		})
	}
}

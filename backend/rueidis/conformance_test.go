package rueidis_test

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// harness gives each store its own client on one shared server.
type harness struct{ srv *redistest.Server }

func (h harness) MakeStore(t *testing.T) core.Store { return newStore(t, h.srv.URL(), relaxed) }

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, harness{redistest.Start(t)})
}

func TestDifferential(t *testing.T) {
	t.Parallel()
	storetest.RunDifferential(t, harness{redistest.Start(t)})
}

func TestDistributedAccuracy(t *testing.T) {
	t.Parallel()
	storetest.RunDistributed(t, harness{redistest.Start(t)}, 4, 2*time.Second)
}

func BenchmarkAllow(b *testing.B) {
	srv := redistest.Start(b)
	l, err := core.NewLimiter(newStore(b, srv.URL(), hfrueidis.ClientOptions{}), core.Options{})
	if err != nil {
		b.Fatal(err)
	}
	p, err := tokenbucket.Policy("bench", 1_000_000, 1_000_000)
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Allow(context.Background(), p, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

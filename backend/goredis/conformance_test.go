package goredis_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/backend/goredis"
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

// TestDistributedAccuracy is not parallel: its 95% lower bound on admitted
// requests needs the CPU that the other tests' servers would take.
func TestDistributedAccuracy(t *testing.T) {
	storetest.RunDistributed(t, harness{redistest.Start(t)}, 4, 3*time.Second)
}

func BenchmarkAllow(b *testing.B) {
	storetest.BenchAllow(b, newStore(b, redistest.Start(b).URL(), goredis.ClientOptions{}))
}

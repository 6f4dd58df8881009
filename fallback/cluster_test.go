package fallback_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// TestClusterFailover runs 4 instances on a real 3-master/3-replica Redis
// Cluster, both backends, and kills the master that holds the hot key under
// load: its replica takes over, no caller sees an error, and the instances
// together stay within the bound.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	for _, tc := range []struct {
		backend string
		p       core.Policy
	}{
		{"goredis", must(tokenbucket.Policy("ctb", 10, 20))},
		{"rueidis", must(slidingwindow.Policy("csw", 20, time.Second))},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			in := startInstances(t, tc.backend, c.URL(), 4, "")
			time.Sleep(300 * time.Millisecond)
			key := fmt.Sprint("hot-", tc.backend)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			failed := make(chan struct{})
			go func() {
				defer close(failed)
				time.Sleep(1500 * time.Millisecond)
				m := c.MasterFor(t, driver.StorageKey("hf:", tc.p.Name(), key))
				m.Kill()
				c.WaitPromoted(t, m, driver.StorageKey("hf:", tc.p.Name(), key), 20*time.Second)
			}()
			var ld load
			start := time.Now()
			in.drive(ctx, tc.p, key, 4, 2*time.Millisecond, &ld)
			<-failed
			b := bound(tc.p, time.Since(start))
			r := float64(ld.admitted.Load()) / b
			record("cluster: kill the key's master (replica promoted)", tc.backend, tc.p, &ld, b)
			t.Logf("admitted %d denied %d errors %d: ratio %.3f, slowest %v", ld.admitted.Load(), ld.denied.Load(), ld.errors.Load(), r, time.Duration(ld.worst.Load()))
			if ld.errors.Load() != 0 {
				t.Errorf("%d errors reached callers", ld.errors.Load())
			}
			if r > 1.05 || r < 0.85 {
				t.Errorf("admitted/bound = %.3f, want within [0.85, 1.05]", r)
			}
		})
	}
}

// clusterHarness makes stores on a Redis Cluster for the storetest suites.
type clusterHarness struct{ backend, url string }

func (h clusterHarness) MakeStore(t *testing.T) driver.Store { return newStore(t, h.backend, h.url) }

// TestClusterConformance runs the step tables (every script, no CROSSSLOT)
// and the 4-instance accuracy test against a 3-master/3-replica cluster,
// through both backends.
func TestClusterConformance(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	for _, backend := range []string{"goredis", "rueidis"} {
		h := clusterHarness{backend, c.URL()}
		t.Run(backend, func(t *testing.T) {
			t.Run("conformance", func(t *testing.T) { storetest.Run(t, h) })
			t.Run("distributed", func(t *testing.T) { storetest.RunDistributed(t, h, 4, 2*time.Second) })
		})
	}
}

package fallback_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// spendCounter counts, for one storage key, the token bucket admissions
// and refunds Redis made: their difference is what the key's bucket was
// spent.
type spendCounter struct {
	key              string
	admits, refunded atomic.Int64
}

func (s *spendCounter) count(sc *driver.Script, keys []string, r []int64) {
	if len(keys) > 0 && keys[0] == s.key && len(r) > 0 && r[0] == 1 {
		switch sc.Name() {
		case tokenbucket.Name:
			s.admits.Add(1)
		case tokenbucket.Name + "_refund":
			s.refunded.Add(1)
		}
	}
}

// TestAllowAllFourInstances: 4 instances, a client hammering a 10/s token
// bucket and a 50/min sliding window charged together (the per-second one
// first) for 6 s: neither bound is exceeded, the per-minute one binds
// (50 < 10 + 10/s × 6 s), and the per-second bucket is spent by the
// admitted requests only: Redis's admissions of it minus its refunds equal
// the admitted requests it decided, however many requests the per-minute
// window denied after the per-second bucket admitted them. On one Redis,
// through a 2 s outage of every instance, and on a 3-master Cluster.
func TestAllowAllFourInstances(t *testing.T) {
	t.Parallel()
	single := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3, 0)
	for _, tc := range []struct {
		name, url string
		outage    bool
	}{
		{"redis", single.URL(), false},
		{"outage", single.URL(), true},
		{"cluster", cluster.URL(), false},
	} {
		// The second instance pipelines (one round trip per AllowAll), the
		// others charge in order.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sec := must(tokenbucket.Policy("msec"+tc.name, 10, 10))
			perMin := must(slidingwindow.Policy("mmin"+tc.name, 50, time.Minute))
			key := "client"
			skey := driver.StorageKey("hf:", sec.Name(), key)
			counter := &spendCounter{key: skey}
			var stores []*gate
			in := startInstancesWith(t, []string{tc.url, tc.url, tc.url, tc.url}, "", callTimeout, func(url string) driver.Store {
				g := &gate{Store: newStore(t, "goredis", url), count: counter.count}
				stores = append(stores, g)
				return gated(g, len(stores) == 2)
			})
			time.Sleep(300 * time.Millisecond) // every heartbeat in: 4 instances
			var admitted, remoteAdmitted, secOnly, denied, errs atomic.Int64
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			for _, l := range in.lims {
				for range 2 {
					wg.Go(func() {
						for n := 0; n < 3000 && time.Since(start) < 6*time.Second && ctx.Err() == nil; n++ {
							rs, err := l.AllowAll(ctx, core.Request{Policy: sec, Key: key}, core.Request{Policy: perMin, Key: key})
							switch {
							case err != nil:
								errs.Add(1)
							case core.AllAllowed(rs):
								admitted.Add(1)
								if rs[0].Mode == core.ModeRedis {
									remoteAdmitted.Add(1)
								}
							default:
								denied.Add(1)
								if rs[0].Allowed {
									secOnly.Add(1)
								}
							}
							time.Sleep(2 * time.Millisecond)
						}
					})
				}
			}
			if tc.outage {
				time.Sleep(time.Second)
				for _, s := range stores {
					s.down.Store(true)
				}
				time.Sleep(2 * time.Second)
				for _, s := range stores {
					s.down.Store(false)
				}
			}
			wg.Wait()
			admits, refunded := counter.admits.Load(), counter.refunded.Load()
			t.Logf("admitted %d (%d through Redis), denied %d (%d of them admitted by the per-second bucket alone), errors %d; per-second bucket: %d admissions − %d refunds",
				admitted.Load(), remoteAdmitted.Load(), denied.Load(), secOnly.Load(), errs.Load(), admits, refunded)
			if errs.Load() != 0 {
				t.Errorf("%d errors", errs.Load())
			}
			// The per-minute window binds: at most 50 (5% more through an
			// outage, as every fault test allows), and no fewer than 90%.
			hi := 50.0
			if tc.outage {
				hi *= 1.05
			}
			if a := float64(admitted.Load()); a > hi || a < 45 {
				t.Errorf("admitted %v, want within [45, %v]", a, hi)
			}
			if secOnly.Load() < 20 {
				t.Errorf("only %d requests admitted by the per-second bucket and denied by the window: the test did not reach the case it is about", secOnly.Load())
			}
			if net := admits - refunded; net != remoteAdmitted.Load() {
				t.Errorf("per-second bucket spent %d times in Redis (%d − %d refunds), want %d: the requests it admitted", net, admits, refunded, remoteAdmitted.Load())
			}
		})
	}
}

package fallback_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/redistest"
)

// modeCount counts one key's decisions by the path that made them, within
// and outside a window of interest.
type modeCount struct {
	ld                 load
	inRedis, inLocal   atomic.Int64 // decisions made while the window was open
	inRedisAdmitted    atomic.Int64 // of inRedis, admissions
	outRedis, outLocal atomic.Int64
	victim             bool // the key's master is the one killed
}

// shardOf lists an instance's shards' breaker states.
func shardOf(st fallback.Status) string {
	var b strings.Builder
	for _, s := range st.Shards {
		fmt.Fprintf(&b, "[%s %s]", s.Slots, s.Breaker)
	}
	return b.String()
}

// TestClusterShardScope kills one master of a 3-master cluster without
// replicas, under load on a key in each shard: only the dead shard's key goes
// to local leases, the two healthy shards' keys keep deciding through Redis
// the whole time, and once the master is back every key returns to Redis and
// stays within its bound.
func TestClusterShardScope(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0, redistest.WithAOF())
	for _, tc := range []struct {
		backend string
		p       core.Policy
	}{
		{"goredis", must(tokenbucket.Policy("scope", 10, 20))},
		{"rueidis", must(slidingwindow.Policy("scopesw", 20, time.Second))},
	} {
		backend, p := tc.backend, tc.p
		t.Run(backend, func(t *testing.T) {
			in := startInstances(t, backend, c.URL(), 4, "")
			waitShards(t, in, 3)

			// One key per master.
			keys := map[*redistest.Server]string{}
			var order []*redistest.Server
			for i := 0; len(keys) < 3 && i < 1000; i++ {
				k := backend + "-k" + strconv.Itoa(i)
				m := c.MasterFor(t, driver.StorageKey("hf:", p.Name(), k))
				if _, ok := keys[m]; !ok {
					keys[m] = k
					order = append(order, m)
				}
			}
			if len(keys) != 3 {
				t.Fatalf("found keys for %d masters, want 3", len(keys))
			}
			victim := order[0]
			// The slot map agrees with the cluster's.
			for i := range 50 {
				k := driver.StorageKey("hf:", p.Name(), fmt.Sprint("slot{}", i, "}x"))
				if got, want := strconv.Itoa(driver.HashSlot(k)), order[1].Do(t, "CLUSTER", "KEYSLOT", k); got != want {
					t.Fatalf("HashSlot(%q) = %s, CLUSTER KEYSLOT says %s", k, got, want)
				}
			}

			var window atomic.Bool
			counts := map[string]*modeCount{}
			for m, k := range keys {
				counts[k] = &modeCount{victim: m == victim}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			for _, k := range keys {
				mc := counts[k]
				for w := range 4 {
					wg.Go(func() {
						for n := w; ctx.Err() == nil; n++ {
							t0 := time.Now()
							r, err := in.lims[n%len(in.lims)].Allow(context.Background(), p, k)
							mc.ld.observe(time.Since(t0))
							inWin := window.Load()
							switch {
							case err != nil:
								mc.ld.errors.Add(1)
							case r.Mode == core.ModeRedis && inWin:
								mc.inRedis.Add(1)
								if r.Allowed {
									mc.inRedisAdmitted.Add(1)
								}
								if mc.victim {
									// A denial from the denial memory, or
									// (a failure) an admission: say when and
									// where.
									t.Logf("%s: %s answered in mode redis during the outage at +%v: %+v (shards %s)",
										in.lims[n%len(in.lims)].Status().ID, k, time.Since(start).Round(time.Millisecond), r, shardOf(in.lims[n%len(in.lims)].Status()))
								}
							case inWin:
								mc.inLocal.Add(1)
							case r.Mode == core.ModeRedis:
								mc.outRedis.Add(1)
							default:
								mc.outLocal.Add(1)
							}
							switch {
							case err == nil && r.Allowed:
								mc.ld.admitted.Add(1)
							case err == nil:
								mc.ld.denied.Add(1)
							}
							time.Sleep(2 * time.Millisecond)
						}
					})
				}
			}
			// Kill the victim at 1.5 s; look from 2 s (the breakers have
			// tripped) to 4.5 s; restart at 4.5 s.
			time.Sleep(1500 * time.Millisecond)
			victim.Kill()
			time.Sleep(500 * time.Millisecond)
			window.Store(true)
			var st fallback.Status
			time.Sleep(time.Second)
			st = in.lims[0].Status()
			time.Sleep(1500 * time.Millisecond)
			window.Store(false)
			victim.Restart(t)
			wg.Wait()
			elapsed := time.Since(start)
			c.WaitHealthy(t, 20*time.Second)

			open := 0
			for _, s := range st.Shards {
				if s.Breaker != "closed" {
					open++
				}
			}
			if st.Breaker != "open" || open != 1 {
				t.Errorf("status during the outage: breaker %q, %d of %d shards not closed (%+v); want open, 1 of 3", st.Breaker, open, len(st.Shards), st.Shards)
			}
			b := bound(p, elapsed)
			for m, k := range keys {
				mc := counts[k]
				r := float64(mc.ld.admitted.Load()) / b
				t.Logf("%s (victim %v): window redis %d local %d; outside redis %d local %d; admitted %d = %.3f of bound; errors %d",
					k, m == victim, mc.inRedis.Load(), mc.inLocal.Load(), mc.outRedis.Load(), mc.outLocal.Load(), mc.ld.admitted.Load(), r, mc.ld.errors.Load())
				if m == victim {
					record("cluster, no replicas: one master killed 3 s and restarted; key on that shard", backend, p, &mc.ld, b)
				} else {
					record(fmt.Sprintf("cluster, no replicas: one master killed 3 s and restarted; key on a healthy shard (%d of its decisions in the outage, all through Redis)", mc.inRedis.Load()), backend, p, &mc.ld, b)
				}
				if mc.ld.errors.Load() != 0 {
					t.Errorf("%s: %d errors reached callers", k, mc.ld.errors.Load())
				}
				if m == victim {
					// Nothing is admitted on Redis's word while the master is
					// down. A denial Redis made before the kill may still be
					// answered from the denial memory (mode redis) until its
					// retry time: an instance whose calls on the key were all
					// answered from memory has seen no failure, so its shard's
					// breaker is still closed. That is right (no unit can come
					// back earlier), and it is what a run saw 0.5 s after the
					// kill: a denial with 57 µs left, every breaker closed.
					if admitted, local := mc.inRedisAdmitted.Load(), mc.inLocal.Load(); local == 0 || admitted != 0 {
						t.Errorf("%s on the dead shard: %d admitted in mode redis, %d decided locally while it was down; want none and some", k, admitted, local)
					}
				} else if local, all := mc.inLocal.Load(), mc.inLocal.Load()+mc.inRedis.Load(); all == 0 || 4*local > all {
					// A healthy shard's breaker may still trip on its own
					// slow calls on a loaded machine (a few hundred local
					// decisions have been seen under -race); a breaker
					// scoped to the whole store would make them all local.
					t.Errorf("%s on a healthy shard: %d of %d decisions local while another shard was down; want (almost) all through Redis", k, local, all)
				}
				if r > 1.05 || r < 0.85 {
					t.Errorf("%s: admitted/bound = %.3f, want within [0.85, 1.05]", k, r)
				}
			}
			// Every shard is back: each instance decides the victim's key
			// through Redis again.
			deadline := time.Now().Add(10 * time.Second)
			for _, l := range in.lims {
				for {
					r, err := l.Allow(context.Background(), p, keys[victim])
					if err == nil && r.Mode == core.ModeRedis {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: the victim's key still decided %v (%v) 10 s after the restart", l.Status().ID, r.Mode, err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
}

// waitShards waits until every instance has read the cluster topology.
func waitShards(t *testing.T, in *instances, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, l := range in.lims {
		for len(l.Status().Shards) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d shards known, want %d", l.Status().ID, len(l.Status().Shards), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

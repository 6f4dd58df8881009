package fallback_test

import (
	"context"
	"fmt"
	"strings"
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
// spent. It also counts the refund calls a gate refused while down, of
// that key (lost) and of any (lostAll).
type spendCounter struct {
	key                             string
	admits, refunded, lost, lostAll atomic.Int64
	// full counts the refunds that found the bucket full (reply 0: its
	// key had expired): refill had given the charge back before the
	// refund came, on a machine slow enough that the window's call took
	// longer than the bucket's time to refill.
	full atomic.Int64
}

func (s *spendCounter) refused(sc *driver.Script, keys []string) {
	if !strings.HasSuffix(sc.Name(), "_refund") {
		return
	}
	s.lostAll.Add(1)
	if len(keys) > 0 && keys[0] == s.key {
		s.lost.Add(1)
	}
}

func (s *spendCounter) count(sc *driver.Script, keys []string, r []int64) {
	if len(keys) == 0 || keys[0] != s.key || len(r) == 0 {
		return
	}
	switch {
	case sc.Name() == tokenbucket.Name && r[0] == 1:
		s.admits.Add(1)
	case sc.Name() == tokenbucket.Name+"_refund" && r[0] == 1:
		s.refunded.Add(1)
	case sc.Name() == tokenbucket.Name+"_refund":
		s.full.Add(1)
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
// Through the outage, a refund the breaker kept from Redis is applied
// when it returns; only a refund whose call failed stays spent, and each
// instance's Status counts it lost.
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
			// A deadline no call reaches on a loaded machine: a call past
			// it is a fault (its outcome unknown, so its spend stays, and
			// the instance decides locally), which only the outage case
			// injects, by refusing calls at once.
			in := startInstancesWith(t, []string{tc.url, tc.url, tc.url, tc.url}, "", 5*time.Second, func(url string) driver.Store {
				g := &gate{Store: newStore(t, "goredis", url), count: counter.count, refused: counter.refused}
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
			// Every instance's pending refunds applied (bounded wait).
			var pending, lostSeen int
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				pending, lostSeen = 0, 0
				for _, l := range in.lims {
					st := l.Status()
					pending += st.PendingRefunds
					lostSeen += int(st.LostRefunds)
				}
				if pending == 0 || time.Now().After(end) {
					break
				}
			}
			admits, refunded, lost := counter.admits.Load(), counter.refunded.Load()+counter.full.Load(), counter.lost.Load()
			t.Logf("admitted %d (%d through Redis), denied %d (%d of them admitted by the per-second bucket alone), errors %d; per-second bucket: %d admissions − %d refunds (%d of them to a bucket refilled full), %d refunds refused by the cut; Status: %d refunds lost, %d pending",
				admitted.Load(), remoteAdmitted.Load(), denied.Load(), secOnly.Load(), errs.Load(), admits, refunded, counter.full.Load(), lost, lostSeen, pending)
			if pending != 0 {
				t.Errorf("%d refunds still pending after the outage", pending)
			}
			if int64(lostSeen) != counter.lostAll.Load() {
				t.Errorf("Status counts %d refunds lost, the gates refused %d", lostSeen, counter.lostAll.Load())
			}
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
			// Spent by the requests it admitted, and by the refunds whose
			// call failed (a handful, at the cut; none without an outage).
			if net := admits - refunded; net != remoteAdmitted.Load()+lost {
				t.Errorf("per-second bucket spent %d times in Redis (%d − %d refunds), want %d: the %d requests it admitted and the %d refunds refused by the cut", net, admits, refunded, remoteAdmitted.Load()+lost, remoteAdmitted.Load(), lost)
			}
			if lost > 8 {
				t.Errorf("%d refunds lost: more than one a client goroutine", lost)
			}
		})
	}
}

// TestAllowAllRefundKept: a refund the breaker keeps from Redis (it opened
// between the charge and the refund) is not lost: it waits, Status shows
// it pending, and it is applied once when Redis returns. The per-minute
// window (1/min, spent first) denies in Redis and the breaker trips with
// that reply; the per-second bucket's charge is then refunded only after
// the outage: its Redis spend goes from 2 to 1, the one admitted request.
// Charged in order and pipelined. When the kept refund's own call fails
// at the recovery it is not sent again (it may have been applied): it is
// counted lost and the bucket stays spent twice.
func TestAllowAllRefundKept(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, pipelined := range []bool{false, true} {
		for _, failApply := range []bool{false, true} {
			t.Run(fmt.Sprintf("pipelined=%v/apply_fails=%v", pipelined, failApply), func(t *testing.T) {
				t.Parallel()
				refundKept(t, srv, pipelined, failApply)
			})
		}
	}
}

func refundKept(t *testing.T, srv *redistest.Server, pipelined, failApply bool) {
	name := fmt.Sprintf("%v%v", pipelined, failApply)
	sec := must(tokenbucket.Policy("ksec"+name, 10, 10))
	perMin := must(slidingwindow.Policy("kmin"+name, 1, time.Minute))
	l, g := newGatedPipe(t, "goredis", srv, false, pipelined)
	counter := &spendCounter{key: driver.StorageKey("hf:", sec.Name(), "client")}
	var tripped atomic.Bool
	g.refused = counter.refused
	g.count = func(sc *driver.Script, keys []string, r []int64) {
		counter.count(sc, keys, r)
		if sc.Name() == slidingwindow.Name && len(r) > 0 && r[0] == 0 && !tripped.Swap(true) {
			g.down.Store(true)
			l.Breaker().Trip(nil)
		}
	}
	ctx := context.Background()
	reqs := []core.Request{{Policy: sec, Key: "client"}, {Policy: perMin, Key: "client"}}
	if rs, err := l.AllowAll(ctx, reqs...); err != nil || !core.AllAllowed(rs) {
		t.Fatalf("first AllowAll: %v, %v; want both admitted", rs, err)
	}
	rs, err := l.AllowAll(ctx, reqs...)
	if err != nil || len(rs) != 2 || !rs[0].Allowed || rs[1].Allowed {
		t.Fatalf("second AllowAll: %v, %v; want the bucket's admission and the window's denial", rs, err)
	}
	if !tripped.Load() {
		t.Fatal("the window's denial did not come from Redis")
	}
	st := l.Status()
	if st.PendingRefunds != 1 || st.LostRefunds != 0 {
		t.Fatalf("during the outage: %d refunds pending, %d lost; want 1 and 0", st.PendingRefunds, st.LostRefunds)
	}
	if net := counter.admits.Load() - counter.refunded.Load(); net != 2 {
		t.Fatalf("during the outage the bucket is spent %d times in Redis, want 2", net)
	}
	var failed atomic.Int64
	if failApply {
		fail := func(sc *driver.Script) bool {
			return sc.Name() == tokenbucket.Name+"_refund" && failed.Add(1) == 1
		}
		g.fail.Store(&fail)
	}
	g.down.Store(false)
	for end := time.Now().Add(5 * time.Second); (l.Status().PendingRefunds > 0 || l.Status().Breaker != "closed") && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	st = l.Status()
	net := counter.admits.Load() - counter.refunded.Load()
	t.Logf("after the outage: breaker %s, %d pending, %d lost; bucket spent %d (%d − %d)", st.Breaker, st.PendingRefunds, st.LostRefunds, net, counter.admits.Load(), counter.refunded.Load())
	wantLost, wantNet := uint64(0), int64(1)
	if failApply {
		wantLost, wantNet = 1, 2
		if n := failed.Load(); n != 1 {
			t.Errorf("the refund was sent %d times at the recovery, want once", n)
		}
	}
	if st.Breaker != "closed" || st.PendingRefunds != 0 || st.LostRefunds != wantLost {
		t.Errorf("after the outage: breaker %s, %d refunds pending, %d lost; want closed, 0, %d", st.Breaker, st.PendingRefunds, st.LostRefunds, wantLost)
	}
	if net != wantNet {
		t.Errorf("after the outage the bucket is spent %d times in Redis, want %d", net, wantNet)
	}
	if n := counter.lostAll.Load(); n != 0 {
		t.Errorf("the gate refused %d refunds, want 0: the breaker kept the refund", n)
	}
}

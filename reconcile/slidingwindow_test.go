package reconcile_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
)

// TestSlidingWindowReplayTTL: the replay leaves the window key living until
// its newest unit leaves the window, never shorter than it was: a fresh key
// gets the TTL of the newest grant, a key whose newer decisions gave it a
// longer TTL keeps it, an older TTL is extended, and a key without a TTL
// gets one covering its newest member. Large costs cross the script's ZADD
// chunks and still count every unit once.
func TestSlidingWindowReplayTTL(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			store := newStore(t, srv)
			const window = 10 * time.Second
			p, _ := slidingwindow.Policy("sw", 10_000, window)
			r := newFor(mode, reconcile.Options{})
			replay := func(key, id string, grants ...driver.Grant) {
				t.Helper()
				b := driver.Batch{ID: id, Key: key, Policy: p, Grants: grants}
				if errs := reconcileIn(t, mode, r, store, []driver.Batch{b}); errs[0] != nil {
					t.Fatal(errs[0])
				}
			}
			pttl := func(key string) time.Duration {
				t.Helper()
				ms, err := strconv.ParseInt(srv.Do(t, "PTTL", key), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return time.Duration(ms) * time.Millisecond
			}
			// within reports whether d is want, give or take the test's own time.
			within := func(d, want time.Duration) bool { return d <= want+time.Millisecond && d >= want-time.Second }
			now := redisNow(t, srv)

			fresh := driver.StorageKey("hf:", "sw", "fresh")
			replay(fresh, "app1:e1:1", driver.Grant{ID: "a", Cost: 1, At: now - 4_000_000}, driver.Grant{ID: "b", Cost: 1, At: now - 3_000_000})
			if d := pttl(fresh); !within(d, window-3*time.Second) {
				t.Errorf("fresh key: PTTL %v, want about %v (the newest grant's)", d, window-3*time.Second)
			}

			// A decision after the outage left a unit at now: its TTL is the whole
			// window, and replaying older grants keeps it.
			live := driver.StorageKey("hf:", "sw", "live")
			srv.Do(t, "ZADD", live, fmt.Sprint(now), "decided")
			srv.Do(t, "PEXPIRE", live, fmt.Sprint(window.Milliseconds()+1))
			replay(live, "app1:e1:2", driver.Grant{ID: "a", Cost: 1, At: now - 5_000_000})
			if d := pttl(live); !within(d, window) {
				t.Errorf("key with a newer unit: PTTL %v, want about %v (kept)", d, window)
			}

			// An old key's TTL is extended to cover the newer grant.
			old := driver.StorageKey("hf:", "sw", "old")
			srv.Do(t, "ZADD", old, fmt.Sprint(now-8_000_000), "decided")
			srv.Do(t, "PEXPIRE", old, "2000")
			replay(old, "app1:e1:3", driver.Grant{ID: "a", Cost: 1, At: now - 1_000_000})
			if d := pttl(old); !within(d, window-time.Second) {
				t.Errorf("old key: PTTL %v, want about %v (extended)", d, window-time.Second)
			}

			// A key without a TTL gets one covering its newest member; in
			// plain writes (the fresh mode: a batch without a seed), the
			// batch's newest (slidingwindow.PlainWrites).
			forever := driver.StorageKey("hf:", "sw", "forever")
			srv.Do(t, "ZADD", forever, fmt.Sprint(now-1_000_000), "decided")
			replay(forever, "app1:e1:4", driver.Grant{ID: "a", Cost: 1, At: now - 6_000_000})
			want := window - time.Second
			if mode == "fresh" {
				want = window - 6*time.Second
			}
			if d := pttl(forever); !within(d, want) {
				t.Errorf("key without a TTL: PTTL %v, want about %v", d, want)
			}

			// Grants only outside the window add nothing and leave the TTL alone.
			replay(old, "app1:e1:5", driver.Grant{ID: "stale", Cost: 1, At: now - 20_000_000})
			if n := srv.Do(t, "ZCARD", old); n != "2" {
				t.Errorf("old key after a stale grant: ZCARD %s, want 2", n)
			}

			// 1200 units in two grants span several ZADD chunks; replaying them
			// under another batch id adds nothing.
			big := driver.StorageKey("hf:", "sw", "big")
			gs := []driver.Grant{{ID: "x", Cost: 700, At: now - 2_000_000}, {ID: "y", Cost: 500, At: now - 1_000_000}}
			replay(big, "app1:e1:7", gs...)
			replay(big, "app1:e1:6", gs...)
			if n := srv.Do(t, "ZCARD", big); n != "1200" {
				t.Errorf("ZCARD %s, want 1200", n)
			}
			if s, _ := strconv.ParseFloat(srv.Do(t, "ZSCORE", big, "x#699"), 64); int64(s) != now-2_000_000 {
				t.Errorf("x#699 scored %v, want %d", s, now-2_000_000)
			}
		})
	}
}

package slidingcounter_test

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

// leaseState decodes a lease's AppendBinary: its counter, whether it holds
// one, and its carry.
func leaseState(t *testing.T, l driver.Lease) (slidingcounter.State, bool, int64) {
	t.Helper()
	data := l.AppendBinary(nil)
	var v [5]int64
	for i := range v {
		x, n := binary.Varint(data)
		if n <= 0 {
			t.Fatalf("lease bytes %x: truncated", l.AppendBinary(nil))
		}
		v[i], data = x, data[n:]
	}
	return slidingcounter.State{Window: v[0], Cur: v[1], Prev: v[2]}, v[3] == 1, v[4]
}

// TestObserve: what replies tell of a key, as the lease started from them
// holds it: the estimate, split between the reply's window and the one
// before by the least the window before held — its estimate late in that
// window less the most its own previous window could weigh then, or the
// limit less the cost of a denial told to retry in a later window. Taken
// whole as the current count (as before the split), the estimate half-way
// through a window would leave a lease nothing more in it.
func TestObserve(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	alg := p.Algorithm().(driver.Leaser)
	k := storetest.T0 / 1_000_000
	type reply struct {
		cost int64
		r    driver.Reply
	}
	at := func(us int64) int64 { return storetest.T0 + us }
	admit := func(us, remaining int64) reply {
		return reply{1, driver.Reply{Allowed: true, Remaining: remaining, ResetAfter: 2e6, Now: at(us)}}
	}
	deny := func(us, cost, retry int64) reply {
		return reply{cost, driver.Reply{RetryAfter: retry, ResetAfter: 2e6, Now: at(us)}}
	}
	for _, tc := range []struct {
		name    string
		replies []reply
		want    slidingcounter.State // the lease's counter
	}{
		{"admission", []reply{admit(0, 6)}, slidingcounter.State{Window: k, Cur: 4}},
		{"denial_retry_this_window", []reply{deny(1, 1, 5)}, slidingcounter.State{Window: k, Cur: 10}},
		// 10 a ms before the window's end: at least 10 − ⌈2 × 10 × 0.001⌉
		// = 9 then. Half-way through the next, 7: 9 × 0.5 of it (4 and a
		// half, 4 rounded down) is the window before's, 3 this window's.
		{"split", []reply{admit(-1000, 0), admit(500_000, 3)}, slidingcounter.State{Window: k, Cur: 3, Prev: 9}},
		// A later reply of the same window keeps what the first told.
		{"split_later", []reply{admit(-1000, 0), admit(500_000, 3), admit(600_000, 2)}, slidingcounter.State{Window: k, Cur: 5, Prev: 9}},
		// 10 two windows ago tells nothing of the window before.
		{"known_too_old", []reply{admit(-1_000_001, 0), admit(500_000, 3)}, slidingcounter.State{Window: k, Cur: 7}},
		// Early in the window before, its estimate tells little.
		{"known_early", []reply{admit(-900_000, 0), admit(500_000, 3)}, slidingcounter.State{Window: k, Cur: 7}},
		// A denial of 2 told to retry in the next window: this window
		// holds at least 8. The lease counts the whole estimate now; next
		// window, 9 at 200 ms is 8 × 0.8 (6) of this window's and 3 of its
		// own.
		{"denial_next_window", []reply{deny(100_000, 2, 950_000)}, slidingcounter.State{Window: k, Cur: 10}},
		{"after_denial_next_window", []reply{deny(100_000, 2, 950_000), admit(1_200_000, 1)}, slidingcounter.State{Window: k + 1, Cur: 3, Prev: 8}},
	} {
		var seed driver.Seed
		for _, r := range tc.replies {
			seed = alg.Observe(p, seed, r.cost, r.r)
		}
		if last := tc.replies[len(tc.replies)-1].r.Now; seed.At != last {
			t.Errorf("%s: seed at %d, want the last reply's time %d", tc.name, seed.At, last)
		}
		got, ok, carry := leaseState(t, alg.NewLease(p, seed, seed.At))
		if got != tc.want || !ok || carry != 0 {
			t.Errorf("%s: lease %+v (%v, carry %d), want %+v", tc.name, got, ok, carry, tc.want)
		}
	}
	// An estimate alone, nothing known of either window, is the current
	// count.
	if got, _, _ := leaseState(t, alg.NewLease(p, driver.Seed{Value: 6, At: at(500_000)}, at(500_000))); got != (slidingcounter.State{Window: k, Cur: 6}) {
		t.Errorf("estimate alone: lease %+v", got)
	}
}

// leaseStep is one decision of a lease under n instances.
type leaseStep struct {
	at         time.Duration
	cost       int64
	allowed    bool
	remaining  int64
	retryAfter time.Duration
	resetAfter time.Duration
}

// TestLeaseShare: step tables of one instance's 1/n share, in sub-units:
// a unit weighs n against the limit, and the known count weighs its own
// count.
func TestLeaseShare(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name  string
		limit int64
		n     int64
		known driver.Seed
		steps []leaseStep
	}{
		{
			// 10 a second over 3 instances: 3 units (9 of 10 sub-units)
			// a window, from the 4 sub-units Redis last reported.
			name: "third_of_ten", limit: 10, n: 3,
			known: driver.Seed{Value: 4, At: storetest.T0},
			steps: []leaseStep{
				{0, 1, true, 1, 0, 2 * time.Second},
				{0, 1, true, 0, 0, 2 * time.Second},
				// 10 sub-units: 3 more fit once 10 × (1 s − e) ≤ 7.
				{0, 1, false, 0, 1300 * ms, 2 * time.Second},
				{1300 * ms, 1, true, 0, 0, 1700 * ms},
				{1300 * ms, 2, false, 0, 600 * ms, 1700 * ms},
				// 12 sub-units never fit in 10: wait a window.
				{1300 * ms, 4, false, 0, time.Second, 1700 * ms},
				{1900 * ms, 1, true, 1, 0, 1100 * ms},
				{3 * time.Second, 3, true, 0, 0, 2 * time.Second},
			},
		},
		{
			// What Redis reported two windows ago is gone.
			name: "stale_known", limit: 10, n: 3,
			known: driver.Seed{Value: 9, At: storetest.T0 - 2_000_000},
			steps: []leaseStep{
				{0, 3, true, 0, 0, 2 * time.Second},
				// The window's count has room for 1 of the 3 sub-units.
				// Next window 3 more fit once 9 × (1 s − e) ≤ (7 + 2) × 1 s:
				// at its start, with the 2 sub-units carried (the room this
				// window and the idle ones before it left, at most a unit
				// less one sub-unit).
				{0, 1, false, 0, time.Second, 2 * time.Second},
			},
		},
		{
			// A limit below the instance count still admits a unit: the
			// local limit is n sub-units, one unit.
			name: "limit_below_instances", limit: 2, n: 3,
			steps: []leaseStep{
				{0, 1, true, 0, 0, 2 * time.Second},
				{0, 1, false, 0, 2 * time.Second, 2 * time.Second},
				{1999 * ms, 1, false, 0, 1 * ms, 1 * ms},
				{2 * time.Second, 1, true, 0, 0, 2 * time.Second},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := must(slidingcounter.Policy("sc", tc.limit, time.Second))
			l := p.Algorithm().(driver.Leaser).NewLease(p, tc.known, storetest.T0)
			for i, st := range tc.steps {
				now := storetest.T0 + st.at.Microseconds()
				got := l.Decide(p, tc.n, now, st.cost)
				want := driver.Reply{Allowed: st.allowed, Remaining: st.remaining, RetryAfter: st.retryAfter.Microseconds(), ResetAfter: st.resetAfter.Microseconds(), Now: now}
				if got != want {
					t.Fatalf("step %d (at %v cost %d):\n got %+v\nwant %+v", i, st.at, st.cost, got, want)
				}
			}
		})
	}
}

// TestLeaseOneInstance: a lease of one instance decides as the script
// does, and one decoded from its AppendBinary at any point goes on as it
// would have.
func TestLeaseOneInstance(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 5, 10*time.Millisecond))
	alg := p.Algorithm().(driver.Leaser)
	l := alg.NewLease(p, driver.Seed{}, storetest.T0)
	var st slidingcounter.State
	var ok bool
	now := storetest.T0
	for i := range 500 {
		now += int64(i*7919) % 4000
		cost := int64(i%5 + 1)
		if i%50 == 0 {
			back, err := alg.LoadLease(p, l.AppendBinary(nil))
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			l = back
		}
		got := l.Decide(p, 1, now, cost)
		next, changed, r := slidingcounter.Decide(st, ok, now, 5, 10_000, cost)
		if changed {
			st, ok = next, true
		}
		if want := driver.ReplyOf(r); got != want {
			t.Fatalf("step %d: lease %+v, script twin %+v", i, got, want)
		}
	}
}

// TestLeaseCharge: a grant read back from the state dir counts in the
// window of its time, beyond the share if need be; one older than the
// window before the lease's counts nothing.
func TestLeaseCharge(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	alg := p.Algorithm().(driver.Leaser)
	const n = 2
	l := alg.NewLease(p, driver.Seed{}, storetest.T0)
	l.Charge(p, n, storetest.T0+100_000, 3) // 6 sub-units now
	l.Charge(p, n, storetest.T0-1, 4)       // 8 in the window before
	l.Charge(p, n, storetest.T0-1_000_001, 9)
	// 6 + ⌈8 × 0.9⌉ = 14 of 10 sub-units: over the share; one more unit
	// (2 sub-units) fits once 8 × (1 s − e) ≤ 2 × 1 s, at e = 750 ms.
	now := storetest.T0 + 100_000
	want := driver.Reply{Remaining: 0, RetryAfter: 650_000, ResetAfter: 1_900_000, Now: now}
	if r := l.Decide(p, n, now, 1); r != want {
		t.Fatalf("after the charges: %+v, want %+v", r, want)
	}
}

// TestLeaseLoadBadBytes: a lease cut short, with a trailing byte, a bad
// flag or a negative count or carry is an error, not a panic.
func TestLeaseLoadBadBytes(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	alg := p.Algorithm().(driver.Leaser)
	l := alg.NewLease(p, driver.Seed{Value: 3, At: storetest.T0}, storetest.T0)
	data := l.AppendBinary(nil)
	for cut := range len(data) {
		if _, err := alg.LoadLease(p, data[:cut]); !errors.Is(err, core.ErrMalformedReply) {
			t.Errorf("a lease cut at byte %d of %d: %v", cut, len(data), err)
		}
	}
	if _, err := alg.LoadLease(p, append(data, 1)); !errors.Is(err, core.ErrMalformedReply) {
		t.Errorf("a trailing byte: %v", err)
	}
	for _, v := range [][5]int64{{1, 2, 3, 2, 0}, {1, 2, 3, 1, -1}, {1, -2, 3, 1, 0}} {
		var bad []byte
		for _, x := range v {
			bad = binary.AppendVarint(bad, x)
		}
		if _, err := alg.LoadLease(p, bad); !errors.Is(err, core.ErrMalformedReply) {
			t.Errorf("window, counts, flag and carry %v: %v", v, err)
		}
	}
	if back, err := alg.LoadLease(p, data); err != nil || !reflect.DeepEqual(back.AppendBinary(nil), data) {
		t.Errorf("round trip: %v", err)
	}
}

// TestLeaseKeepsFractions: a lease of 20 a second over 4 instances, asked
// all the time, admits 5, 5, 5, 4 units a window, 19 of the shared
// counter's units over the 4 leases as the counter itself admits; never
// more than its 5 in a fixed window. Without the carry the last unit of
// each window never fits (it would need the previous window to weigh
// nothing) and each lease admits 4, 16 over the 4.
func TestLeaseKeepsFractions(t *testing.T) {
	const lim, n, w = 20, 4, 1_000_000
	p := must(slidingcounter.Policy("sc", lim, time.Second))
	l := p.Algorithm().(driver.Leaser).NewLease(p, driver.Seed{}, storetest.T0)
	perWindow := map[int64]int64{}
	const windows = 40
	for now := storetest.T0; now < storetest.T0+windows*w; now += 1000 {
		if l.Decide(p, n, now, 1).Allowed {
			perWindow[now/w]++
		}
	}
	k := storetest.T0 / w
	var total int64
	for j := k; j < k+windows; j++ {
		got := perWindow[j]
		if got > lim/n {
			t.Errorf("window %d: %d admitted, more than the share %d", j-k, got, lim/n)
		}
		if j > k {
			total += got
		}
	}
	// The first window has no window before: 5. Then 19 × 39 ÷ 4 = 185.25.
	if perWindow[k] != 5 || total < 185 || total > 186 {
		t.Errorf("admitted %d in the first window, %d in the 39 after it; want 5, and 185 or 186 (19 a window over 4 leases): per window %v", perWindow[k], total, perWindow)
	}
}

// TestLeasesKeepThePace: n instances send a client's requests (one every
// 250 µs, in turn) to one shared counter, each remembering a denial until
// its retry time as the fallback does and observing its replies; the store
// goes away at some point of a window, and each instance goes on with a
// lease from what it observed. Over the next 6 windows the leases together
// admit within a few units of what the counter would have admitted alone
// (at least 97%, at most n units more), and no fixed window admits more
// than the limit. Taking the estimate whole as the current count and
// losing each lease's last unit a window, they admitted 0.73 to 0.87 of it
// at 20 a second over 4 instances.
func TestLeasesKeepThePace(t *testing.T) {
	const w, step = 1_000_000, 250
	for _, tc := range []struct{ lim, n int64 }{{20, 4}, {20, 2}, {100, 4}, {10, 1}} {
		p := must(slidingcounter.Policy("sc", tc.lim, time.Second))
		alg := p.Algorithm().(driver.Leaser)
		// Killed a window after the key's first, spent at once (what the
		// instances see of it are denials till its end), or later.
		for _, killWindow := range []int64{1, 3} {
			for phase := int64(0); phase < w; phase += 37_000 {
				kill := storetest.T0 + killWindow*w + phase
				end := kill + 6*w
				var shared, alone slidingcounter.State
				var sharedOK, aloneOK bool
				known := make([]driver.Seed, tc.n)
				until := make([]int64, tc.n)
				var leases []driver.Lease
				fixed := map[int64]int64{}
				var want, got int64
				for i, now := int64(0), storetest.T0; now < end; i, now = i+1, now+step {
					if next, admit, _ := slidingcounter.Decide(alone, aloneOK, now, tc.lim, w, 1); admit {
						alone, aloneOK = next, true
						if now >= kill {
							want++
						}
					}
					in := i % tc.n
					if now < kill {
						if now < until[in] {
							continue
						}
						next, admit, r := slidingcounter.Decide(shared, sharedOK, now, tc.lim, w, 1)
						if admit {
							shared, sharedOK = next, true
							fixed[now/w]++
						} else {
							until[in] = now + r[2]
						}
						known[in] = alg.Observe(p, known[in], 1, driver.ReplyOf(r))
						continue
					}
					if leases == nil {
						for _, seed := range known {
							leases = append(leases, alg.NewLease(p, seed, now))
						}
					}
					if leases[in].Decide(p, tc.n, now, 1).Allowed {
						got++
						fixed[now/w]++
					}
				}
				if float64(got) < 0.97*float64(want) || got > want+tc.n {
					t.Errorf("%d a second over %d instances, killed %d µs into window %d: the leases admitted %d in 6 windows, the counter alone %d", tc.lim, tc.n, phase, killWindow, got, want)
				}
				for j, c := range fixed {
					if c > tc.lim {
						t.Errorf("%d a second over %d instances, killed %d µs into window %d: %d admitted in window %d", tc.lim, tc.n, phase, killWindow, c, j-storetest.T0/w)
					}
				}
			}
		}
	}
}

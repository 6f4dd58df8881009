package slidingcounter_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/storetest"
)

// TestObserve: a reply's known state is the estimate it implies, at its
// time.
func TestObserve(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	alg := p.Algorithm().(core.Leaser)
	for _, tc := range []struct {
		r    core.Reply
		want core.Seed
	}{
		{core.Reply{Allowed: true, Remaining: 6, ResetAfter: 2e6, Now: storetest.T0}, core.Seed{Value: 4, At: storetest.T0}},
		{core.Reply{Remaining: 0, RetryAfter: 5, ResetAfter: 2e6, Now: storetest.T0 + 1}, core.Seed{Value: 10, At: storetest.T0 + 1}},
	} {
		if got := alg.Observe(p, tc.r); got != tc.want {
			t.Errorf("Observe(%+v) = %+v, want %+v", tc.r, got, tc.want)
		}
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
		known core.Seed
		steps []leaseStep
	}{
		{
			// 10 a second over 3 instances: 3 units (9 of 10 sub-units)
			// a window, from the 4 sub-units Redis last reported.
			name: "third_of_ten", limit: 10, n: 3,
			known: core.Seed{Value: 4, At: storetest.T0},
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
			known: core.Seed{Value: 9, At: storetest.T0 - 2_000_000},
			steps: []leaseStep{
				{0, 3, true, 0, 0, 2 * time.Second},
				// 3 more fit once 9 × (1 s − e) ≤ 7 × 1 s next window.
				{0, 1, false, 0, 1222223 * time.Microsecond, 2 * time.Second},
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
			l := p.Algorithm().(core.Leaser).NewLease(p, tc.known, storetest.T0)
			for i, st := range tc.steps {
				now := storetest.T0 + st.at.Microseconds()
				got := l.Decide(p, tc.n, now, st.cost)
				want := core.Reply{Allowed: st.allowed, Remaining: st.remaining, RetryAfter: st.retryAfter.Microseconds(), ResetAfter: st.resetAfter.Microseconds(), Now: now}
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
	alg := p.Algorithm().(core.Leaser)
	l := alg.NewLease(p, core.Seed{}, storetest.T0)
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
		if want := core.ReplyOf(r); got != want {
			t.Fatalf("step %d: lease %+v, script twin %+v", i, got, want)
		}
	}
}

// TestLeaseCharge: a grant read back from the state dir counts in the
// window of its time, beyond the share if need be; one older than the
// window before the lease's counts nothing.
func TestLeaseCharge(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	alg := p.Algorithm().(core.Leaser)
	const n = 2
	l := alg.NewLease(p, core.Seed{}, storetest.T0)
	l.Charge(p, n, storetest.T0+100_000, 3) // 6 sub-units now
	l.Charge(p, n, storetest.T0-1, 4)       // 8 in the window before
	l.Charge(p, n, storetest.T0-1_000_001, 9)
	// 6 + ⌈8 × 0.9⌉ = 14 of 10 sub-units: over the share; one more unit
	// (2 sub-units) fits once 8 × (1 s − e) ≤ 2 × 1 s, at e = 750 ms.
	now := storetest.T0 + 100_000
	want := core.Reply{Remaining: 0, RetryAfter: 650_000, ResetAfter: 1_900_000, Now: now}
	if r := l.Decide(p, n, now, 1); r != want {
		t.Fatalf("after the charges: %+v, want %+v", r, want)
	}
}

// TestLeaseLoadBadBytes: a lease cut short, with a trailing byte or with a
// bad flag is an error, not a panic.
func TestLeaseLoadBadBytes(t *testing.T) {
	p := must(slidingcounter.Policy("sc", 10, time.Second))
	alg := p.Algorithm().(core.Leaser)
	l := alg.NewLease(p, core.Seed{Value: 3, At: storetest.T0}, storetest.T0)
	data := l.AppendBinary(nil)
	for cut := range len(data) {
		if _, err := alg.LoadLease(p, data[:cut]); !errors.Is(err, core.ErrMalformedReply) {
			t.Errorf("a lease cut at byte %d of %d: %v", cut, len(data), err)
		}
	}
	if _, err := alg.LoadLease(p, append(data, 1)); !errors.Is(err, core.ErrMalformedReply) {
		t.Errorf("a trailing byte: %v", err)
	}
	bad := append(data[:len(data)-1:len(data)-1], 4) // the flag 2
	if _, err := alg.LoadLease(p, bad); !errors.Is(err, core.ErrMalformedReply) {
		t.Errorf("flag 2: %v", err)
	}
	if back, err := alg.LoadLease(p, data); err != nil || !reflect.DeepEqual(back.AppendBinary(nil), data) {
		t.Errorf("round trip: %v", err)
	}
}

// Package storetest is the conformance suite every driver.Store runs: the same
// step tables with fixed instants against each backend, so the Lua scripts
// (Redis backends) and their Go twins (memory backend) are proven to agree.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// A Harness makes the store under test.
type Harness interface {
	// MakeStore returns a store that the suite may use for the rest of t.
	// Keys the suite writes are unique to each test.
	MakeStore(t *testing.T) driver.Store
}

// T0 is the fixed instant every step table starts from, in microseconds.
const T0 = int64(1_767_225_600_000_000) // 2026-01-01T00:00:00Z

// Step is one decision of a table: at T0+At, spend Cost, expect the reply.
type Step struct {
	At         time.Duration
	Cost       int64
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// Table is a policy and the decisions it must produce for one key.
type Table struct {
	Name   string
	Policy core.Policy
	Steps  []Step
}

func must(p core.Policy, err error) core.Policy {
	if err != nil {
		panic(err)
	}
	return p
}

const ms = time.Millisecond

// Tables are the step tables every store must pass.
var Tables = append([]Table{
	{
		Name:   "token_bucket/drain_and_refill",
		Policy: must(tokenbucket.Policy("tb3", 3, 1)),
		Steps: []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: time.Second},
			{At: 0, Cost: 1, Allowed: true, Remaining: 1, ResetAfter: 2 * time.Second},
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			{At: 0, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: 3 * time.Second},
			{At: 500 * ms, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 2500 * ms},
			{At: 1000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			{At: 1999 * ms, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 1 * ms, ResetAfter: 2001 * ms},
			{At: 2000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			// Ten idle seconds refill only up to the capacity.
			{At: 12 * time.Second, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			{At: 12 * time.Second, Cost: 2, Allowed: false, Remaining: 0, RetryAfter: 2 * time.Second, ResetAfter: 3 * time.Second},
			{At: 13500 * ms, Cost: 2, Allowed: false, Remaining: 1, RetryAfter: 500 * ms, ResetAfter: 1500 * ms},
			{At: 14 * time.Second, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
		},
	},
	{
		Name:   "token_bucket/clock_behind_state",
		Policy: must(tokenbucket.Policy("tb2", 2, 2)),
		Steps: []Step{
			{At: 5 * time.Second, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			// A clock behind the stored update time finds the bucket as it
			// was then: a second earlier it held a second less (a debt),
			// so a clock that steps back never refills the same time twice.
			{At: 4 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 1500 * ms, ResetAfter: 2 * time.Second},
			{At: 5 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: time.Second},
			{At: 5500 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			// 200 ms before the last admission the (then empty) bucket
			// held 200 ms less: a debt.
			{At: 5300 * ms, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 700 * ms, ResetAfter: 1200 * ms},
			{At: 6 * time.Second, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		},
	},
	{
		Name:   "token_bucket/fractional_rate",
		Policy: must(tokenbucket.Policy("tb-third", 2, 3)), // 333333 µs a token
		Steps: []Step{
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 666666 * time.Microsecond},
			{At: 333332 * time.Microsecond, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Microsecond, ResetAfter: 333334 * time.Microsecond},
			{At: 333333 * time.Microsecond, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 666666 * time.Microsecond},
		},
	},
	{
		Name:   "sliding_window/exact_window",
		Policy: must(slidingwindow.Policy("sw3", 3, time.Second)),
		Steps: []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: time.Second},
			{At: 100 * ms, Cost: 1, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{At: 200 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 300 * ms, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 700 * ms, ResetAfter: 900 * ms},
			{At: 999 * ms, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 1 * ms, ResetAfter: 201 * ms},
			// The unit admitted at 0 leaves the window (now-W, now] at 1 s.
			{At: 1000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 1000 * ms, Cost: 2, Allowed: false, Remaining: 0, RetryAfter: 200 * ms, ResetAfter: time.Second},
			{At: 1200 * ms, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 1200 * ms, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 800 * ms, ResetAfter: time.Second},
			{At: 5 * time.Second, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		},
	},
	{
		Name:   "sliding_window/cost_above_remaining",
		Policy: must(slidingwindow.Policy("sw5", 5, 2*time.Second)),
		Steps: []Step{
			{At: 0, Cost: 2, Allowed: true, Remaining: 3, ResetAfter: 2 * time.Second},
			{At: 500 * ms, Cost: 2, Allowed: true, Remaining: 1, ResetAfter: 2 * time.Second},
			// 4 in the window; 3 more need the 2 oldest gone (both at 0).
			{At: 600 * ms, Cost: 3, Allowed: false, Remaining: 1, RetryAfter: 1400 * ms, ResetAfter: 1900 * ms},
			{At: 2000 * ms, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Second},
		},
	},
}, slidingCounterTables...)

var seq atomic.Int64

// TB is the part of testing.TB (and rapid.T) the suite's helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Run runs the conformance suite against the harness.
func Run(t *testing.T, h Harness) {
	for _, tb := range Tables {
		t.Run(tb.Name, func(t *testing.T) {
			t.Parallel()
			s := h.MakeStore(t)
			key := driver.StorageKey("storetest:", tb.Policy.Name(), fmt.Sprintf("%s-%d", t.Name(), seq.Add(1)))
			for i, st := range tb.Steps {
				got := Decide(t, s, tb.Policy, key, st.Cost, T0+st.At.Microseconds())
				want := driver.Reply{
					Allowed: st.Allowed, Remaining: st.Remaining,
					RetryAfter: st.RetryAfter.Microseconds(), ResetAfter: st.ResetAfter.Microseconds(),
					Now: T0 + st.At.Microseconds(),
				}
				if got != want {
					t.Fatalf("step %d (at %v cost %d):\n got %+v\nwant %+v", i, st.At, st.Cost, got, want)
				}
			}
		})
	}
	t.Run("independent_keys", func(t *testing.T) {
		t.Parallel()
		s := h.MakeStore(t)
		p := must(tokenbucket.Policy("tb1", 1, 1))
		for i := range 20 {
			key := driver.StorageKey("storetest:", p.Name(), fmt.Sprintf("%s-%d-%d", t.Name(), seq.Add(1), i))
			if r := Decide(t, s, p, key, 1, T0); !r.Allowed {
				t.Fatalf("key %d: first request denied: %+v", i, r)
			}
			if r := Decide(t, s, p, key, 1, T0); r.Allowed {
				t.Fatalf("key %d: second request admitted: %+v", i, r)
			}
		}
	})
	t.Run("ops", func(t *testing.T) {
		t.Parallel()
		testOps(t, h.MakeStore(t))
	})
	t.Run("nil_context", func(t *testing.T) {
		t.Parallel()
		s := h.MakeStore(t)
		p := must(tokenbucket.Policy("tb1", 1, 1))
		key := driver.StorageKey("storetest:", p.Name(), t.Name())
		var nilCtx context.Context
		if _, err := s.Run(nilCtx, p.Algorithm().Script(), []string{key}, p.Algorithm().Args(p, 1, "", 0)); !errors.Is(err, core.ErrNilContext) {
			t.Fatalf("Run with a nil context: %v, want ErrNilContext", err)
		}
		if pl, ok := s.(driver.Pipeliner); ok {
			res := pl.RunMany(nilCtx, []driver.Call{{Script: p.Algorithm().Script(), Keys: []string{key}, Args: p.Algorithm().Args(p, 1, "", 0)}})
			if !errors.Is(res[0].Err, core.ErrNilContext) {
				t.Fatalf("RunMany with a nil context: %v, want ErrNilContext", res[0].Err)
			}
		}
		if pg, ok := s.(driver.Pinger); ok && !errors.Is(pg.Ping(nilCtx), core.ErrNilContext) {
			t.Fatal("Ping with a nil context: want ErrNilContext")
		}
	})
}

// Decide runs one decision of p on store s at nowMicros (0: the store's
// clock) and returns the parsed reply, failing t on error.
func Decide(t TB, s driver.Store, p core.Policy, key string, cost, nowMicros int64) driver.Reply {
	t.Helper()
	id := ""
	if p.Algorithm().NeedsID() {
		id = "id-" + strconv.FormatInt(seq.Add(1), 10)
	}
	raw, err := s.Run(context.Background(), p.Algorithm().Script(), []string{key}, p.Algorithm().Args(p, cost, id, nowMicros))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	r, err := driver.ParseReply(raw)
	if err != nil {
		t.Fatalf("ParseReply: %v", err)
	}
	return r
}

package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// An OpsLimiter is what the operations suite drives: core.Limiter, or a
// fallback.Limiter over the store.
type OpsLimiter interface {
	core.MultiDecider
	Peek(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error)
	Reset(ctx context.Context, p core.Policy, key string) error
}

// opsPolicies returns, for each algorithm, a pair of policies of limits 5
// and 3 that refill or slide so slowly that a test sees no refill: every
// figure below is exact.
func opsPolicies(prefix string) [][2]core.Policy {
	const hour = time.Hour
	return [][2]core.Policy{
		{must(tokenbucket.Policy(prefix+"tb5", 5, 5.0/3600)), must(tokenbucket.Policy(prefix+"tb3", 3, 3.0/3600))},
		{must(slidingwindow.Policy(prefix+"sw5", 5, hour)), must(slidingwindow.Policy(prefix+"sw3", 3, hour))},
		{must(slidingcounter.Policy(prefix+"sc5", 5, hour)), must(slidingcounter.Policy(prefix+"sc3", 3, hour))},
	}
}

// RunOps checks Peek, Reset and AllowAll of l with exact values, for every
// built-in algorithm: Peek spends nothing and answers what AllowN then
// does; Reset gives a full quota back; AllowAll admits only when every
// policy does, and a denial spends none of the others.
func RunOps(t *testing.T, l OpsLimiter) {
	ctx := context.Background()
	for _, pair := range opsPolicies(fmt.Sprintf("ops%d", seq.Add(1))) {
		a, b := pair[0], pair[1]
		t.Run(a.Algorithm().Name(), func(t *testing.T) {
			key := "client"
			check := func(what string, r core.Result, err error, allowed bool, remaining int64) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if r.Allowed != allowed || r.Remaining != remaining {
					t.Fatalf("%s: allowed %v remaining %d, want %v and %d (%+v)", what, r.Allowed, r.Remaining, allowed, remaining, r)
				}
			}
			// Peek spends nothing, and AllowN answers what it said.
			for range 3 {
				r, err := l.Peek(ctx, a, key, 2)
				check("peek of 2 on a fresh key", r, err, true, 3)
			}
			r, err := l.AllowN(ctx, a, key, 2)
			check("AllowN of 2 after the peeks", r, err, true, 3)
			r, err = l.Peek(ctx, a, key, 3)
			check("peek of 3 with 3 left", r, err, true, 0)
			r, err = l.Peek(ctx, a, key, 4)
			check("peek of 4 with 3 left", r, err, false, 3)
			r, err = l.AllowN(ctx, a, key, 3)
			check("AllowN of the last 3", r, err, true, 0)
			r, err = l.Peek(ctx, a, key, 1)
			check("peek on an empty quota", r, err, false, 0)
			// Reset gives the whole quota back.
			if err := l.Reset(ctx, a, key); err != nil {
				t.Fatalf("Reset: %v", err)
			}
			r, err = l.AllowN(ctx, a, key, 1)
			check("AllowN after Reset", r, err, true, 4)
			if err := l.Reset(ctx, a, key); err != nil {
				t.Fatalf("second Reset: %v", err)
			}

			// AllowAll over a (5) and b (3): three admitted, then b denies
			// and a is not spent by the denied ones.
			key = "multi"
			both := []core.Request{{Policy: a, Key: key}, {Policy: b, Key: key}}
			for i := range 3 {
				rs, err := l.AllowAll(ctx, both...)
				if err != nil || !core.AllAllowed(rs) || rs[0].Remaining != int64(4-i) || rs[1].Remaining != int64(2-i) {
					t.Fatalf("AllowAll %d: %+v, %v; want both admitted, remaining %d and %d", i, rs, err, 4-i, 2-i)
				}
			}
			for i := range 4 {
				rs, err := l.AllowAll(ctx, both...)
				if err != nil || core.AllAllowed(rs) || core.Denied(rs) != 1 {
					t.Fatalf("AllowAll %d past b's limit: %+v, %v; want b's denial", i+3, rs, err)
				}
				// a admits it alone (2 left, 1 after it) and is not spent.
				if !rs[0].Allowed || rs[0].Remaining != 1 || rs[1].Remaining != 0 {
					t.Fatalf("AllowAll %d past b's limit: %+v; want a's own answer (1 left after it), b's with 0", i+3, rs)
				}
			}
			r, err = l.Peek(ctx, a, key, 2)
			check("a after b's denials (peek of 2)", r, err, true, 0)
			// b first: its denial is the first; a is peeked, not spent.
			rs, err := l.AllowAll(ctx, core.Request{Policy: b, Key: key}, core.Request{Policy: a, Key: key, Cost: 2})
			if err != nil || core.Denied(rs) != 0 || !rs[1].Allowed || rs[1].Remaining != 0 {
				t.Fatalf("AllowAll(b, a×2): %+v, %v; want b denied and a's peek (admits, 0 left)", rs, err)
			}
			r, err = l.AllowN(ctx, a, key, 2)
			check("a's last 2", r, err, true, 0)
			// Several keys of one policy are several quotas.
			rs, err = l.AllowAll(ctx, core.Request{Policy: b, Key: "k1", Cost: 3}, core.Request{Policy: b, Key: "k2", Cost: 3})
			if err != nil || !core.AllAllowed(rs) || rs[0].Remaining != 0 || rs[1].Remaining != 0 {
				t.Fatalf("AllowAll over two keys: %+v, %v", rs, err)
			}
		})
	}
}

// testOps runs RunOps on core.Limiter over the store.
func testOps(t *testing.T, s driver.Store) {
	l, err := core.NewLimiter(s, core.Options{Prefix: fmt.Sprintf("ops%d:", seq.Add(1))})
	if err != nil {
		t.Fatal(err)
	}
	RunOps(t, l)
}

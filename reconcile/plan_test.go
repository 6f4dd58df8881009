package reconcile

import (
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core/driver"
)

// TestPlanBounds: one instance's batches go MultiBatches to a call; a
// batch that would take a call past MultiArgs starts the next, one of more
// goes alone; batches of another instance, or of another algorithm, go in
// calls of their own; every batch is in exactly one call.
func TestPlanBounds(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 10, 1)
	sw, _ := slidingwindow.Policy("sw", 10_000, time.Minute)
	grants := func(n int) []driver.Grant {
		gs := make([]driver.Grant, n)
		for i := range gs {
			gs[i] = driver.Grant{ID: fmt.Sprint("g", i), Cost: 1, At: int64(1_000_000 + i)}
		}
		return gs
	}
	var batches []driver.Batch
	add := func(id string, p driver.Policy, n int) {
		batches = append(batches, driver.Batch{ID: id, Key: driver.StorageKey("hf:", p.Name(), id), Policy: p, Grants: grants(n)})
	}
	for i := range 40 {
		add(fmt.Sprint("a:p:", i), tb, 1) // 40 small: 16, 16, 8
	}
	add("a:p:40", sw, 1000) // 3004 arguments: alone
	add("b:p:1", tb, 1)     // another instance
	add("a:p:41", sw, 600)  // 1804: a call of its own, then
	add("a:p:42", sw, 100)  // 304, past 2048 with it: the next call
	add("a:p:43", sw, 10)   // beside it
	// Calls come out as they fill, then each group's last, in the order
	// the groups first appeared.
	r := New(Options{MultiBatches: 16})
	errs := make([]error, len(batches))
	prep, idx := make([]prepared, len(batches)), make([]int, len(batches))
	for i := range idx {
		idx[i] = i
	}
	r.prepare(batches, idx, false, errs, prep)
	units := r.plan(prep, idx)
	var got []int
	seen := map[int]int{}
	for _, u := range units {
		got = append(got, len(u.batches))
		for _, i := range u.batches {
			seen[i]++
		}
		if n := len(u.call.Keys) - 1 + len(u.call.Args); len(u.batches) > 1 && n > DefaultMultiArgs {
			t.Errorf("a call of %d batches has %d keys and arguments", len(u.batches), n)
		}
	}
	if want := "[16 16 1 1 8 2 1]"; fmt.Sprint(got) != want {
		t.Errorf("calls of %v batches, want %s", got, want)
	}
	for i := range batches {
		if seen[i] != 1 || errs[i] != nil {
			t.Errorf("batch %d in %d calls (%v)", i, seen[i], errs[i])
		}
	}
}

package driver_test

import (
	"slices"
	"testing"

	"github.com/holdfast/holdfast/core/driver"
)

// TestSplitMany: a Many reply splits into each decision's reply, nil for
// one refused at its deadline; a reply of another length or an unknown
// status is not one.
func TestSplitMany(t *testing.T) {
	reply := []int64{0, 1, 2, 0, 5, 9, driver.ManyStale, 0, 0, 0, 0, 0, 0, 0, 7, 3, 4, 9}
	got, ok := driver.SplitMany(reply, 3)
	if !ok || len(got) != 3 || !slices.Equal(got[0], []int64{1, 2, 0, 5, 9}) || got[1] != nil || !slices.Equal(got[2], []int64{0, 7, 3, 4, 9}) {
		t.Fatalf("SplitMany = %v, %v", got, ok)
	}
	if _, ok := driver.SplitMany(reply, 2); ok {
		t.Error("a reply of 3 decisions split as 2")
	}
	bad := slices.Clone(reply)
	bad[driver.ManyStride] = 2
	if _, ok := driver.SplitMany(bad, 3); ok {
		t.Error("status 2 accepted")
	}
}

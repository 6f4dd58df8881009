package slidingwindow_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/storetest"
)

// TestLeaseShareAndRoundTrip runs storetest's lease checks on the
// algorithm's lease twin.
func TestLeaseShareAndRoundTrip(t *testing.T) {
	p, _ := slidingwindow.Policy("p", 20, 4*time.Second)
	storetest.RunLease(t, p)
}

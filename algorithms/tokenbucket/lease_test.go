package tokenbucket_test

import (
	"testing"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/storetest"
)

// TestLeaseShareAndRoundTrip runs storetest's lease checks on the
// algorithm's lease twin.
func TestLeaseShareAndRoundTrip(t *testing.T) {
	p, _ := tokenbucket.Policy("p", 20, 5)
	storetest.RunLease(t, p)
}

package fallback_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
)

// BenchmarkLocalDecisionWindow is BenchmarkLocalDecision for a sliding
// window: the lease's weighted log and the logged grants with their ids.
func BenchmarkLocalDecisionWindow(b *testing.B) {
	p, _ := slidingwindow.Policy("bench", 1_000_000, time.Millisecond) // windows pass quickly: the lease stays small
	benchLocal(b, p, "")
}

package memory_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/storetest"
)

type harness struct{}

func (harness) MakeStore(t *testing.T) driver.Store {
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, harness{}) }

func TestDifferential(t *testing.T) { storetest.RunDifferential(t, harness{}) }

// shared hands every instance the same store: one process, many goroutines.
type shared struct{ s driver.Store }

func (h shared) MakeStore(*testing.T) driver.Store { return h.s }

func TestConcurrentAccuracy(t *testing.T) {
	storetest.RunDistributed(t, shared{harness{}.MakeStore(t)}, 4, 2*time.Second)
}

func BenchmarkAllow(b *testing.B) {
	s, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchAllow(b, s)
}

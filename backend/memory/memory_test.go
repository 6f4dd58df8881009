package memory_test

import (
	"testing"

	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/storetest"
)

type harness struct{}

func (harness) MakeStore(t *testing.T) core.Store {
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, harness{}) }

package tokenbucket_test

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
)

// TestLeaseShareAndRoundTrip: a lease of a 1/4 share admits the share of a
// fresh policy, and one decoded from its AppendBinary decides as it would
// have; bad bytes are an error, not a panic.
func TestLeaseShareAndRoundTrip(t *testing.T) {
	p, _ := tokenbucket.Policy("p", 20, 5)
	alg := p.Algorithm().(core.Leaser)
	const n, now = 4, int64(1_000_000_000_000)
	l := alg.NewLease(p, core.Seed{}, now)
	admitted := 0
	for i := range 8 {
		if r := l.Decide(p, n, now+int64(i), 1); r.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("a fresh 1/4 share of 20 admitted %d, want 5", admitted)
	}
	back, err := alg.LoadLease(p, l.AppendBinary(nil))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		at := now + int64(i)*int64(150*time.Millisecond/time.Microsecond)
		a, b := l.Decide(p, n, at, 1), back.Decide(p, n, at, 1)
		if a != b {
			t.Fatalf("step %d: lease %+v, decoded lease %+v", i, a, b)
		}
	}
	data := l.AppendBinary(nil)
	for cut := range len(data) {
		if _, err := alg.LoadLease(p, data[:cut]); err == nil && cut < len(data) {
			t.Errorf("a lease cut at byte %d of %d decoded", cut, len(data))
		}
	}
	if _, err := alg.LoadLease(p, append(data, 1)); err == nil {
		t.Error("a lease with a trailing byte decoded")
	}
}

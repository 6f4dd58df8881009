package storetest

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// RunLease checks an algorithm's lease twin (driver.Leaser) with policy p, a
// limit of 20: a lease of a 1/4 share of a fresh policy admits 5; one
// decoded from its AppendBinary decides as it would have, step by step;
// cut or padded bytes are an error, never a panic.
func RunLease(t *testing.T, p core.Policy) {
	t.Helper()
	alg, ok := p.Algorithm().(driver.Leaser)
	if !ok {
		t.Fatalf("%s is not a driver.Leaser", p.Algorithm().Name())
	}
	const n, now = 4, int64(1_000_000_000_000)
	l := alg.NewLease(p, driver.Seed{}, now)
	admitted := 0
	for i := range 8 {
		if r := l.Decide(p, n, now+int64(i), 1); r.Allowed {
			admitted++
		}
	}
	if want := p.Limit() / n; int64(admitted) != want {
		t.Fatalf("a fresh 1/%d share of %d admitted %d, want %d", n, p.Limit(), admitted, want)
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
		if _, err := alg.LoadLease(p, data[:cut]); err == nil {
			t.Errorf("a lease cut at byte %d of %d decoded", cut, len(data))
		}
	}
	if _, err := alg.LoadLease(p, append(data, 1)); err == nil {
		t.Error("a lease with a trailing byte decoded")
	}
}

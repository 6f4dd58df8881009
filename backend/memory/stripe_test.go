package memory

import (
	"hash/maphash"
	"strings"
	"testing"
	"unsafe"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// TestStripeOfMatchesUpdate: RunDirect locks the stripe Update and Run lock
// for the same storage key, for keys built on the stack and streamed alike.
func TestStripeOfMatchesUpdate(t *testing.T) {
	s, err := New(Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, key := range []string{"a", "client-42", "\x00{}:", strings.Repeat("k", 80), strings.Repeat("k", 90), strings.Repeat("k", core.MaxKeyLen)} {
		for _, prefix := range []string{"hf:", "", "a-much-longer-prefix:"} {
			want := &s.locks[maphash.String(s.seed, driver.StorageKey(prefix, "policy", key))%stripes]
			if got := s.stripeOf(prefix, "policy", key); got != want {
				t.Errorf("prefix %q key of %d bytes: stripe %p, Update uses %p", prefix, len(key), got, want)
			}
		}
	}
}

// TestSizes: stripes fill whole cache lines, and an entry stays in the
// allocator's 32-byte class.
func TestSizes(t *testing.T) {
	if n := unsafe.Sizeof(stripe{}); n%64 != 0 {
		t.Errorf("a stripe is %d bytes, want a multiple of 64", n)
	}
	if n := unsafe.Sizeof(entry{}); n > 32 {
		t.Errorf("an entry is %d bytes, want at most 32", n)
	}
}

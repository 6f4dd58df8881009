package memory

import (
	"hash/maphash"
	"strconv"
	"strings"
	"testing"
	"time"
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

// TestOfferInRows: a stripe offers its new keys to the cache offerEvery at
// a time; until then they are found among its pending ones, so an Update
// sees every key it saved, offered or not.
func TestOfferInRows(t *testing.T) {
	s, err := New(Options{MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	for i := 0; len(keys) < offerEvery; i++ {
		k := "k" + strconv.Itoa(i)
		if maphash.String(s.seed, k)%stripes == 0 {
			keys = append(keys, k)
		}
	}
	inCache := func() int {
		s.cache.Wait()
		n := 0
		for _, k := range keys {
			if _, ok := s.cache.Get(k); ok {
				n++
			}
		}
		return n
	}
	for i, k := range keys {
		s.Update(k, func(prev any, _ int64) (any, int64) { return i, int64(time.Hour / time.Microsecond) })
		if i == offerEvery-2 {
			if n := inCache(); n != 0 {
				t.Fatalf("%d of %d held keys are in the cache before the stripe offered them", n, offerEvery-1)
			}
		}
	}
	if n := inCache(); n != offerEvery {
		t.Fatalf("%d of %d keys in the cache after the stripe offered them, want all", n, offerEvery)
	}
	for i, k := range keys {
		s.Update(k, func(prev any, _ int64) (any, int64) {
			if prev != i {
				t.Errorf("key %s holds %v, want %d", k, prev, i)
			}
			return prev, -1
		})
	}
}

// TestEveryNewKeyFound: with room for every key, each key saved is found
// by its next Update, through the held, pending and offered stages.
func TestEveryNewKeyFound(t *testing.T) {
	s, err := New(Options{MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 20000
	life := int64(time.Hour / time.Microsecond)
	for i := range n {
		s.Update("key-"+strconv.Itoa(i), func(prev any, _ int64) (any, int64) { return i, life })
	}
	lost := 0
	for i := range n {
		s.Update("key-"+strconv.Itoa(i), func(prev any, _ int64) (any, int64) {
			if prev != i {
				lost++
			}
			return prev, -1
		})
	}
	if lost != 0 {
		t.Fatalf("%d of %d keys were not found by their next Update", lost, n)
	}
}

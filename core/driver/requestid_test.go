package driver_test

import (
	"encoding/base64"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/holdfast/holdfast/core/driver"
)

// Request ids are 22 base64url characters of 16 bytes, and distinct across
// goroutines drawing from the pooled streams at once.
func TestNewRequestID(t *testing.T) {
	const goroutines, each = 8, 20_000
	ids := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range ids {
		wg.Go(func() {
			for range each {
				ids[g] = append(ids[g], driver.NewRequestID())
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, goroutines*each)
	for _, list := range ids {
		for _, id := range list {
			raw, err := base64.RawURLEncoding.DecodeString(id)
			if len(id) != driver.RequestIDLen || err != nil || len(raw) != 16 {
				t.Fatalf("id %q: length %d, %d bytes, %v", id, len(id), len(raw), err)
			}
			if seen[id] {
				t.Fatalf("id %q drawn twice", id)
			}
			seen[id] = true
		}
	}
}

// BenchmarkRequestID compares NewRequestID with a UUID string, the id the
// sliding window used before.
func BenchmarkRequestID(b *testing.B) {
	b.Run("NewRequestID", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = driver.NewRequestID()
			}
		})
	})
	b.Run("uuid.NewString", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = uuid.NewString()
			}
		})
	})
}

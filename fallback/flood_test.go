package fallback_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/fallback"
)

// TestKeyFlood: 1M distinct keys arrive during an outage, spread over 4
// instances. Each instance's leases and outage log stay within their
// bounds: the log holds at most MaxLogGrants grants, and the heap grows by
// about what the bounds allow; requests past the log bound are denied,
// never admitted unlogged; nothing panics.
func TestKeyFlood(t *testing.T) {
	const instances, perInstance = 4, 250_000
	const maxLog = 100_000
	const heapBound = 32<<20*2 + maxLog*300 + 256*64*250
	p, _ := tokenbucket.Policy("flood", 10, 1)
	ctx := context.Background()
	rss0 := rssBytes()
	for i := range instances {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		l, err := fallback.New(downStore{}, fallback.Options{
			ID: fmt.Sprint("flood", i), ExpectedInstances: instances, MaxLogGrants: maxLog, LeaseBytes: 32 << 20,
			Breaker: fallback.BreakerOptions{Start: fallback.Open},
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		l.MarkStarted()
		admitted, denied := 0, 0
		for k := range perInstance {
			r, err := l.Allow(ctx, p, fmt.Sprintf("client-%d-%d", i, k))
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			} else {
				denied++
			}
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		grown := int64(after.HeapInuse) - int64(before.HeapInuse)
		st := l.Status()
		rss := rssBytes()
		t.Logf("instance %d: %d keys, admitted %d, denied %d, outage log %d grants, heap +%d MiB, process RSS %d MiB (%+d MiB since the flood began)",
			i, perInstance, admitted, denied, st.PendingLog, grown>>20, rss>>20, (rss-rss0)>>20)
		if !raceEnabled { // the race detector's memory is not holdfast's
			note("Key flood during an outage (TestKeyFlood)", fmt.Sprintf(
				"instance %d of %d: %d distinct keys, MaxLogGrants %d, LeaseBytes 32 MiB: admitted %d (all logged), denied %d at the log bound; heap +%d MiB; process RSS %d MiB",
				i+1, instances, perInstance, maxLog, admitted, denied, grown>>20, rss>>20))
		}
		if st.PendingLog > maxLog || admitted != st.PendingLog {
			t.Fatalf("log holds %d grants for %d admitted, bound %d: every admitted grant must be logged, within the bound", st.PendingLog, admitted, maxLog)
		}
		if admitted != maxLog || denied != perInstance-maxLog {
			t.Fatalf("admitted %d, denied %d: want the first %d keys admitted and the rest denied at the bound", admitted, denied, maxLog)
		}
		// 32 MiB of leases by their estimated size (the heap holds up to
		// about 1.5× that, with ristretto's counters and GC slack), plus
		// 100k logged grants of one key each, about 250 bytes apiece,
		// plus the memory store's new keys not yet confirmed by the cache
		// and so not charged to its bound: up to 64 in each of its 256
		// stripes (backend/memory pendingLimit), about 250 bytes apiece.
		if grown > heapBound {
			t.Fatalf("heap grew %d MiB, beyond the bound of %d MiB", grown>>20, heapBound>>20)
		}
		// The instances run one after another: even if the runtime returned
		// nothing to the OS, RSS stays within the sum of their bounds, each
		// doubled for the garbage collector's headroom (GOGC=100 lets the
		// heap reach twice the live data before a collection).
		if limit := int64(i+1) * 2 * heapBound; !raceEnabled && rss0 > 0 && rss-rss0 > limit {
			t.Fatalf("RSS grew %d MiB over %d instances, beyond the sum of their bounds (%d MiB)", (rss-rss0)>>20, i+1, limit>>20)
		}
		l.Close()
	}
}

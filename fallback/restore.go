package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// ErrDataLost is the breaker's cause when Redis was found to have lost its
// data while it kept answering: restarted without persistence, flushed, or
// failed over to a copy that never had it. The membership heartbeat finds
// it (its epoch key is gone or new); the breaker opens, and the recovery
// writes back the known state of every key this instance decided recently
// (see restoreKnown) before any decision goes through Redis again.
var ErrDataLost = errors.New("fallback: Redis lost its data (restarted empty, flushed or failed over to a copy without it)")

// dataLost is ErrDataLost as a store failure: Redis answered, and cannot
// be used as it stands.
var dataLost = &core.StoreError{Class: core.ClassUnavailable, Reason: "datalost", Answered: true, Err: ErrDataLost}

// defaultRestoreKeys is Options.RestoreKeys's default.
const defaultRestoreKeys = 100_000

// recentKeys is a ring of the keys whose known states a restore writes
// back: each key new to the lease store, and a key already in it again
// once half the ring has turned since it was last put in, so a key in use
// stays in the ring while keys used once fall out of it. Its cost on the
// request path is an atomic load a reply, and a locked append for a key new
// or half a ring old.
type recentKeys struct {
	next atomic.Uint64 // sequence number of the next entry
	max  int
	mu   sync.Mutex
	ring []trackedKey
}

// due reports whether a key last put in at sequence number at (0: never)
// should be put in again.
func (r *recentKeys) due(at uint64) bool {
	return at == 0 || r.next.Load()-at >= uint64(r.max/2)
}

// add puts key skey of policy p in the ring and returns its sequence
// number.
func (r *recentKeys) add(skey string, p core.Policy) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.next.Add(1) // 1 for the first: 0 is never
	if len(r.ring) < r.max {
		r.ring = append(r.ring, trackedKey{skey, p})
	} else {
		r.ring[(n-1)%uint64(r.max)] = trackedKey{skey, p}
	}
	return n
}

// snapshot returns the ring's keys, most recent first, each once.
func (r *recentKeys) snapshot() []trackedKey {
	r.mu.Lock()
	n := r.next.Load()
	out := make([]trackedKey, 0, len(r.ring))
	seen := make(map[string]struct{}, len(r.ring))
	for k := range uint64(len(r.ring)) {
		tk := r.ring[(n-1-k)%uint64(len(r.ring))]
		if _, dup := seen[tk.skey]; dup {
			continue
		}
		seen[tk.skey] = struct{}{}
		out = append(out, tk)
	}
	r.mu.Unlock()
	return out
}

// noteEpoch takes the data epoch the heartbeat read (the Redis time at
// which the epoch key was made) and reports whether it differs from the
// one seen before: Redis lost its data since. A restore is then due.
func (l *cell) noteEpoch(epoch int64) bool {
	prev := l.epoch.Swap(epoch)
	if prev == 0 || prev == epoch {
		return false
	}
	l.restoreDue.Store(true)
	l.noteFault(dataLost)
	l.o.Logger.Warn("holdfast: Redis lost its data; known states will be written back", append([]any{"instance", l.o.ID}, l.attrs...)...)
	return true
}

// restoreKnown writes back into Redis, when it lost its data, the known state
// of every key in the recent-keys ring that the lease store still holds:
// a batch of no grants whose seed is the key's known state, which each
// algorithm's replay writes into a missing key (and leaves an existing one
// alone). Keys with grants in the outage log are restored by their own
// batches as well; a key another instance restored first is left as it
// is. It runs in the recovery, before the log's batches, while no decision
// goes through Redis.
func (l *cell) restoreKnown(ctx context.Context) error {
	if !l.restoreDue.Swap(false) {
		return nil
	}
	keys := l.recent.snapshot()
	batches := make([]driver.Batch, 0, len(keys))
	for _, tk := range keys {
		var seed driver.Seed
		l.leases.Update(tk.skey, func(prev any, _ int64) (any, int64) {
			if ks, _ := prev.(*keyState); ks != nil && ks.known.at > 0 {
				seed = ks.known.seed
			}
			return prev, -1 // unchanged
		})
		if seed.At <= 0 {
			continue
		}
		batches = append(batches, driver.Batch{ID: l.log.nextID(), Key: tk.skey, Policy: tk.p, Seed: seed})
	}
	if len(batches) == 0 {
		return nil
	}
	errs := l.rec.Reconcile(ctx, l.store, batches)
	if err := errors.Join(errs...); err != nil {
		l.restoreDue.Store(true) // again, whole: a seed goes only into a missing key
		return fmt.Errorf("fallback: restore after data loss: %w", err)
	}
	l.restored.Add(uint64(len(batches)))
	l.o.Logger.Info("holdfast restored known states", append([]any{"instance", l.o.ID, "keys", len(batches)}, l.attrs...)...)
	return nil
}

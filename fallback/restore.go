package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/reconcile"
)

// ErrDataLost is the breaker's cause when Redis was found to have lost its
// data while it kept answering: restarted without persistence, flushed, or
// failed over to a copy that never had it. A read of the data epoch finds
// it (its key is gone or new); the breaker opens, and the recovery writes
// back the known state of every key this instance decided recently (see
// restoreKnown) before any decision goes through Redis again.
var ErrDataLost = errors.New("fallback: Redis lost its data (restarted empty, flushed or failed over to a copy without it)")

// dataLost is ErrDataLost as a store failure: Redis answered, and cannot
// be used as it stands.
var dataLost = &core.StoreError{Class: core.ClassUnavailable, Reason: "datalost", Answered: true, Err: ErrDataLost}

// defaultRestoreKeys is Options.RestoreKeys's default.
const defaultRestoreKeys = 100_000

// recentKeys is a ring of the keys whose known states a restore writes
// back (and the journal writes when an outage begins): each key new to the
// lease store, and a key already in it again
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

// snapshot returns up to most of the ring's keys, most recent first, each
// once.
func (r *recentKeys) snapshot(most int) []trackedKey {
	r.mu.Lock()
	n := r.next.Load()
	most = min(most, len(r.ring))
	out := make([]trackedKey, 0, most)
	seen := make(map[string]struct{}, most)
	for k := uint64(0); k < uint64(len(r.ring)) && len(out) < most; k++ {
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

// noteEpoch takes the data epoch read at Redis time now (the Redis time at
// which the epoch key was made; renewed: by a renewal, see below) and the
// data generation gen, read by a call sent when the highest generation
// read was sent, and reports whether Redis lost its data since the reads
// before: the epoch differs (Redis lost everything, or another instance
// renewed it), or gen is no higher than sent (Redis went back to an older
// copy of its data: every read raises the generation, so the reads before
// this one were answered by writes it no longer holds). A lower generation
// found once is the new lineage: reads sent before it was found are not
// compared with the old one. A restore is then due; after a generation
// gone back it first renews the epoch, so that the restores of this loss
// are named apart from those of an earlier loss of the same epoch and the
// other instances find the loss too.
func (l *cell) noteEpoch(epoch, now, gen int64, renewed bool, sent int64) bool {
	prev := l.epoch.Swap(epoch)
	seen := l.epochSeen.Swap(now)
	back := prev == epoch && sent > 0 && gen <= sent && l.gen.Load() >= sent
	if back || prev != epoch {
		l.gen.Store(gen)
	} else {
		l.raiseGen(gen)
	}
	if prev == 0 || (prev == epoch && !back) {
		return false
	}
	// The loss came after the last heartbeat that read the old epoch. A
	// reply after that may come from the Redis that lost its data, but
	// only while the breaker was closed: found while it is not, every
	// reply before it opened is taken as from before the loss (the loss
	// opened it, or no decision went through Redis since).
	since := seen
	if l.breaker.State() != Closed {
		since = max(since, l.leftClosed.Load())
	}
	l.lostSince.Store(since)
	if back {
		l.renewFrom.Store(epoch)
	}
	// Due first: from here on replies leave known states alone (observe),
	// since they come from the Redis that lost the data.
	l.restoreDue.Store(true)
	l.rewindKnown(since)
	l.noteFault(dataLost)
	msg := "holdfast: Redis lost its data; known states will be written back"
	if back || renewed {
		msg = "holdfast: Redis went back to an older copy of its data; known states will be written back"
	}
	l.o.Logger.Warn(msg, append([]any{"instance", l.o.ID}, l.attrs...)...)
	return true
}

// renewEpoch makes a new data epoch in place of epoch from, unless another
// instance did first, and takes the epoch Redis then holds: the restores
// that follow are named after it.
func (l *cell) renewEpoch(ctx context.Context, from int64) error {
	ctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
	defer cancel()
	epoch, now, gen, _, err := l.runEpoch(ctx, from)
	if err != nil {
		return err
	}
	l.epoch.Store(epoch)
	l.epochSeen.Store(now)
	l.raiseGen(gen)
	return nil
}

// raiseGen makes gen the highest data generation read, if it is higher.
func (l *cell) raiseGen(gen int64) {
	for g := l.gen.Load(); gen > g && !l.gen.CompareAndSwap(g, gen); g = l.gen.Load() {
	}
}

// rewindKnown makes each recent key's known state one from before the loss
// found now, which came after Redis time since: a reply after since may be
// from the Redis that lost its data (a key started afresh), so such a key
// takes, of the last reply an epoch read confirmed and the replies after
// it, the one that left the least: from before the loss, or from after it
// and then spending more (a restore's charge then errs high). Leases
// started from here on (the breaker opens next) and the restore start from
// it.
func (l *cell) rewindKnown(since int64) {
	for _, tk := range l.recent.snapshot(l.o.RestoreKeys) {
		l.leases.Update(tk.skey, func(prev any, _ int64) (any, int64) {
			ks, _ := prev.(*keyState)
			if ks == nil || ks.known.at <= since {
				return prev, -1
			}
			// The reply that left the least of the confirmed one and
			// those after it.
			k, left := ks.conf, ks.confLeft
			if ks.peak.at > 0 && (k.at == 0 || ks.peakLeft <= left) {
				k = ks.peak
			}
			if k.at > 0 {
				ks.known = k
			}
			return prev, -1 // unchanged size
		})
	}
}

// restoreKnown writes back into Redis, when it lost its data, the known state
// of every key in the recent-keys ring that the lease store still holds,
// logged keys too: their batches, which follow, then find the key and
// merge into it. (Left to its log's seed, a logged key was restored twice
// when another instance's restore added its usage after the log's batch
// had seeded the key: a key emptied meanwhile, by a refund or its expiry,
// took that seed. And when Redis went back to an older copy, the key is
// not missing and takes no seed from a batch.)
// a batch of no grants whose seed is the key's known state (rewound by
// rewindKnown), which each algorithm's replay writes into a missing key
// or adds to what a key decided since the loss holds (driver.Batch.Since).
// Then, in a second call, the grants this instance replayed into Redis
// that the known state does not include (keyState.replayed): a key spent
// only by leases during an earlier outage has no known state at all.
// A key another instance restored first after the same loss is left as it
// is (the shared batch ID). It runs in the recovery, before the log's
// batches, while no decision goes through Redis. A batch Redis refuses as
// a wrong request (a key of another type) is skipped and logged; any other
// failure fails the recovery, which retries every batch (the applied ones
// are marked).
func (l *cell) restoreKnown(ctx context.Context) error {
	if !l.restoreDue.Swap(false) {
		return nil
	}
	if from := l.renewFrom.Swap(0); from != 0 {
		if err := l.renewEpoch(ctx, from); err != nil {
			l.renewFrom.CompareAndSwap(0, from)
			l.restoreDue.Store(true)
			return fmt.Errorf("fallback: renew the data epoch: %w", err)
		}
	}
	keys := l.recent.snapshot(l.o.RestoreKeys)
	epoch, since := l.epoch.Load(), l.lostSince.Load()
	batches := make([]driver.Batch, 0, len(keys))
	var grants []driver.Batch
	both := 0 // keys with a known state and replayed grants
	for _, tk := range keys {
		var seed driver.Seed
		var replayed []driver.Grant
		l.leases.Update(tk.skey, func(prev any, now int64) (any, int64) {
			if ks, _ := prev.(*keyState); ks != nil {
				if ks.known.at > 0 {
					seed = ks.known.seed // rewound by rewindKnown
				}
				replayed = ks.replayedSince(tk.p, now)
			}
			return prev, -1 // unchanged
		})
		if len(replayed) > 0 {
			// Grants this instance replayed that the known state does not
			// include: written back after it (a second call, so that they
			// merge into the key it wrote), under an ID of this instance's
			// own, as every instance writes back its own grants.
			grants = append(grants, driver.Batch{ID: reconcile.RestoreGrantsID(epoch, tk.skey, l.o.ID), Key: tk.skey, Policy: tk.p, Seed: seed, Grants: replayed})
			if seed.At > 0 {
				both++
			}
		}
		if seed.At <= 0 {
			continue
		}
		// One ID for every instance restoring this key after this loss:
		// the first applies it, the others find it applied.
		id := reconcile.RestoreID(epoch, tk.skey)
		// A process that read no epoch before the loss (restarted, its
		// known states read back from the state dir) knows only that the
		// loss came after the state it knew.
		from := since
		if from <= 0 {
			from = seed.At
		}
		batches = append(batches, driver.Batch{ID: id, Key: tk.skey, Policy: tk.p, Seed: seed, Since: from})
	}
	restored, err := l.restoreBatches(ctx, batches)
	if err == nil {
		var more int
		more, err = l.restoreBatches(ctx, grants)
		restored += max(0, more-both) // keys not counted with the first call
	}
	if err != nil {
		l.restoreDue.Store(true)
		return err
	}
	if restored == 0 {
		return nil
	}
	l.restored.Add(uint64(restored))
	l.o.Logger.Info("holdfast restored known states", append([]any{"instance", l.o.ID, "keys", restored, "replayed_grants_keys", len(grants)}, l.attrs...)...)
	return nil
}

// restoreBatches runs a restore's batches and returns how many Redis
// applied. A batch Redis refuses as a wrong request (a key of another
// type) is skipped and logged; any other failure is the error.
func (l *cell) restoreBatches(ctx context.Context, batches []driver.Batch) (int, error) {
	if len(batches) == 0 {
		return 0, nil
	}
	errs := l.rec.Reconcile(ctx, l.store, batches)
	var failed []error
	skipped := 0
	for _, err := range errs {
		switch {
		case err == nil:
		case core.ClassOf(err) == core.ClassRequest:
			skipped++
			if skipped == 1 {
				l.o.Logger.Warn("holdfast restore skipped a key Redis refused", append([]any{"instance", l.o.ID, "err", err.Error()}, l.attrs...)...)
			}
		default:
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return 0, fmt.Errorf("fallback: restore after data loss: %w", errors.Join(failed...))
	}
	return len(batches) - skipped, nil
}

// noteReplayed keeps, with each key's state, the grants of the batches
// that Redis applied (errs[i] nil), and puts the key in the recent-keys
// ring: a key spent only by leases has no known state, and a restore after
// a later data loss writes these grants back instead (restoreKnown). A key
// the lease store no longer holds is passed over.
func (l *cell) noteReplayed(batches []driver.Batch, errs []error) {
	to := l.storeMicros()
	if l.jnl != nil {
		l.jnl.replayed(batches, errs, to)
	}
	for i := range batches {
		b := &batches[i]
		if errs[i] != nil || len(b.Grants) == 0 {
			continue
		}
		l.leases.Update(b.Key, func(prev any, now int64) (any, int64) {
			if ks, _ := prev.(*keyState); ks != nil {
				if l.recent.due(ks.tracked) {
					ks.tracked = l.recent.add(b.Key, b.Policy)
				}
				ks.addReplayed(b.Policy, b.Grants, to, now)
			}
			return prev, -1 // kept as it is: its size changes little
		})
	}
}

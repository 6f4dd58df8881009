package fallback

import (
	"slices"
	"unsafe"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// keyState is what an instance remembers of one key: the last state Redis
// reported (known) and, during an outage, its lease: the local share of the
// key's quota that it enforces alone. What a state means is the
// algorithm's: its driver.Leaser reads a reply and makes the lease.
type keyState struct {
	known  known
	leased bool  // a lease exists
	last   int64 // store time of the lease's last decision
	lease  driver.Lease
	seed   driver.Seed // known state when the lease began, for reconciliation
	deny   denial      // the last Redis denial, answered from memory until its retry time
	live   *liveGrant  // the key's live outage log entry, if any (a coalescing algorithm)
	// tracked is the key's sequence number in the cell's recent-keys
	// ring, 0 before it is put in.
	tracked uint64
	// For a restore (rewindKnown): conf is the latest known state that a
	// read of the data epoch confirmed (Redis still held the data after
	// it), peak the one of the replies since that left the least, and
	// knownLeft, confLeft and peakLeft what each reply left.
	conf, peak                    known
	knownLeft, confLeft, peakLeft int64
	// replayed holds this instance's grants on the key that a replay
	// applied in Redis and that no confirmed known state includes yet
	// (nil when none): a restore writes them back too (restoreKnown),
	// since a key spent only by leases has no known state to restore.
	replayed *replayedGrants
}

// replayedGrants are a key's grants that a replay applied (at most
// maxReplayed, the newest), to, a store time after that replay, and size,
// their bytes for keyState.Size (which the lease store asks at every save).
type replayedGrants struct {
	grants []driver.Grant
	to     int64
	size   int64
}

// maxReplayed bounds the replayed grants a key keeps for a restore.
const maxReplayed = 256

// addReplayed keeps grants of policy p, which a replay applied in Redis by
// store time to, dropping those that no longer count at now.
func (k *keyState) addReplayed(p core.Policy, grants []driver.Grant, to, now int64) {
	if k.replayed == nil {
		k.replayed = &replayedGrants{}
	}
	r := k.replayed
	kept := slices.DeleteFunc(append(r.grants, grants...), func(g driver.Grant) bool { return outdated(p, g.At, now) })
	if len(kept) > maxReplayed {
		kept = append(kept[:0], kept[len(kept)-maxReplayed:]...)
	}
	if len(kept) == 0 {
		k.replayed = nil
		return
	}
	r.grants, r.to = kept, max(r.to, to)
	r.size = int64(unsafe.Sizeof(*r)) + int64(cap(kept))*int64(unsafe.Sizeof(driver.Grant{}))
	for _, g := range kept {
		r.size += int64(len(g.ID))
	}
}

// replayedSince returns the replayed grants that the known state does not
// include (it is older than their replay) and that still count at now.
func (k *keyState) replayedSince(p core.Policy, now int64) []driver.Grant {
	r := k.replayed
	if r == nil || k.known.at > r.to {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(r.grants), func(g driver.Grant) bool { return outdated(p, g.At, now) })
}

// known is the key's state in the last Redis reply, as its algorithm reads
// it (driver.Leaser.Observe); at is the reply's Redis time, zero when
// nothing is known.
type known struct {
	seed driver.Seed
	at   int64
}

// Size is the key's approximate size in bytes, for the lease store's bound.
func (k *keyState) Size() int64 {
	s := int64(unsafe.Sizeof(*k))
	if k.lease != nil {
		s += k.lease.Size()
	}
	if k.replayed != nil {
		s += k.replayed.size
	}
	return s
}

// confirm moves the known state to conf once an epoch read at Redis time
// seen confirmed it, and starts the peak over; observe then takes reply r.
func (k *keyState) confirm(seen int64, r driver.Reply) {
	if k.known.at > 0 && k.known.at <= seen && k.known.at > k.conf.at {
		k.conf, k.confLeft = k.known, k.knownLeft
		k.peak = known{}
		if k.replayed != nil && k.conf.at > k.replayed.to {
			// A confirmed reply after the replay includes its grants.
			k.replayed = nil
		}
	}
	k.knownLeft = r.Remaining
}

// observe records a Redis reply to a request of cost units of policy p.
func (k *keyState) observe(p core.Policy, cost int64, r driver.Reply) {
	if lr, ok := p.Algorithm().(driver.Leaser); ok {
		k.known = known{seed: lr.Observe(p, k.known.seed, cost, r), at: r.Now}
	}
}

// share is one instance's part of a quota: at least one unit, so a policy
// smaller than the instance count still admits something during an outage.
func share(limit, n int64) int64 { return max(limit/n, 1) }

// coalesces reports whether p's grants may be logged as one of their
// summed cost at the latest of their times (driver.Replayer.Coalesces).
func coalesces(p core.Policy) bool {
	rp, ok := p.Algorithm().(driver.Replayer)
	return ok && rp.Coalesces()
}

// outdated reports whether a grant of p made at store time at no longer
// counts at now (driver.Replayer.Outdated).
func outdated(p core.Policy, at, now int64) bool {
	rp, ok := p.Algorithm().(driver.Replayer)
	return ok && rp.Outdated(p, at, now)
}

// decideLease makes a local decision of cost units under the instance's
// 1/n share of policy p and reports it as a Reply in units of the share; it
// returns false when p's algorithm has no lease (it is not a
// driver.Leaser), and the request is then denied.
//
// A lease starts from the known state, and goes on (refilling as a bucket or
// window does) until Redis reports something newer than its last decision:
// across an outage, its recovery and even the next outage when no Redis
// reply came in between. Restarting it from a known state older than its own
// decisions would hand out again what it granted meanwhile.
//
// The reply goes to *out, not up as a result: this is every local
// decision's path, and a result is copied through memory at each call.
func (k *keyState) decideLease(p core.Policy, n, now, cost int64, out *driver.Reply) bool {
	if !k.leased || k.known.at > k.last || k.lease == nil {
		if !k.startLease(p, now) {
			*out = driver.Reply{RetryAfter: p.Interval().Microseconds(), Now: now}
			return false
		}
	}
	k.leased, k.last = true, max(k.last, now)
	*out = k.lease.Decide(p, n, now, cost)
	return true
}

// startLease starts the lease of policy p from the known state, for a first
// decision at now; the known state becomes its seed. The journal's replay
// (keyState.charge) starts a restored lease the same way. It reports false
// when p's algorithm has no lease.
func (k *keyState) startLease(p core.Policy, now int64) bool {
	lr, ok := p.Algorithm().(driver.Leaser)
	if !ok {
		return false
	}
	k.seed = driver.Seed{}
	if k.known.at > 0 {
		k.seed = k.known.seed
	}
	k.lease = lr.NewLease(p, k.seed, now)
	return true
}

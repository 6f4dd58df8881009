package fallback

import (
	"sort"
	"unsafe"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
)

// keyState is what an instance remembers of one key: the last state Redis
// reported (known) and, during an outage, its lease: the local share of the
// key's quota that it enforces alone.
type keyState struct {
	known  known
	leased bool  // a lease exists
	last   int64 // store time of the lease's last decision
	tb     tokenbucket.State
	tbOK   bool
	sw     weightedLog
	seed   core.Seed  // known state when the lease began, for reconciliation
	deny   denial     // the last Redis denial, answered from memory until its retry time
	live   *liveGrant // the key's live outage log entry, if any (token bucket)
}

// known is the key's state in the last Redis reply: for a token bucket its
// credit in microseconds, for a sliding window the units in the window and
// the time of the newest. at is the reply's Redis time; zero means unknown.
type known struct {
	value  int64
	newest int64
	at     int64
}

// Size is the key's approximate size in bytes, for the lease store's bound.
func (k *keyState) Size() int64 {
	return int64(unsafe.Sizeof(*k)) + 16*int64(cap(k.sw.at))
}

// observe records a Redis reply for policy p.
func (k *keyState) observe(p core.Policy, r core.Reply) {
	switch p.Algorithm().Name() {
	case tokenbucket.Name:
		k.known = known{value: p.Limit()*p.Interval().Microseconds() - r.ResetAfter, at: r.Now}
	case slidingwindow.Name:
		newest := r.Now
		if !r.Allowed {
			newest = r.Now + r.ResetAfter - p.Interval().Microseconds()
		}
		k.known = known{value: p.Limit() - r.Remaining, newest: newest, at: r.Now}
	}
}

// share is one instance's part of a quota: at least one unit, so a policy
// smaller than the instance count still admits something during an outage.
func share(limit, n int64) int64 { return max(limit/n, 1) }

// algName is p's algorithm's name, without an interface call for the
// built-in token bucket (the local path's common case).
func algName(p core.Policy) string {
	if a := p.Algorithm(); a != tokenbucket.Algorithm {
		return a.Name()
	}
	return tokenbucket.Name
}

// decideLease makes a local decision of cost units under the instance's
// 1/n share of policy p and reports it as a Reply in units of the share.
//
// A lease starts from the known state, and goes on (refilling as a bucket or
// window does) until Redis reports something newer than its last decision:
// across an outage, its recovery and even the next outage when no Redis
// reply came in between. Restarting it from a known state older than its own
// decisions would hand out again what it granted meanwhile.
func (k *keyState) decideLease(p core.Policy, n, now, cost int64) core.Reply {
	if !k.leased || k.known.at > k.last {
		k.startLease(p, now)
	}
	k.leased, k.last = true, max(k.last, now)
	var r [core.ReplyLen]int64
	switch algName(p) {
	case tokenbucket.Name:
		t := p.Interval().Microseconds()
		// Credit is shared in microseconds: a token costs n·t locally, and a
		// full local bucket holds C·t, or one token when C < n.
		full := max(p.Limit(), n) * t
		var changed bool
		var next tokenbucket.State
		next, changed, r = tokenbucket.DecideCredit(k.tb, k.tbOK, now, full, n*t, cost)
		if changed {
			k.tb, k.tbOK = next, true
		}
	case slidingwindow.Name:
		w := p.Interval().Microseconds()
		r = k.sw.decide(now, max(p.Limit(), n), w, n, cost)
	}
	return core.Reply{Allowed: r[0] == 1, Remaining: r[1], RetryAfter: r[2], ResetAfter: r[3], Now: r[4]}
}

// startLease starts the lease of policy p from the known state, for a first
// decision at now; the known state becomes its seed. The journal's replay
// (keyState.charge) starts a restored lease the same way.
func (k *keyState) startLease(p core.Policy, now int64) {
	k.seed = core.Seed{Value: k.known.value, At: k.known.at}
	switch algName(p) {
	case tokenbucket.Name:
		k.tb, k.tbOK = tokenbucket.State{Credit: k.known.value, Last: k.known.at}, k.known.at > 0
	case slidingwindow.Name:
		k.seed.At = k.known.newest
		k.sw = weightedLog{}
		if k.known.at > 0 && k.known.newest > now-p.Interval().Microseconds() {
			k.sw.add(k.known.newest, k.known.value)
		}
	}
}

// weightedLog is a sliding window counted in sub-units: one local unit
// weighs n (the instance count) against a limit of L, so an instance admits
// L/n units per window; the carried-in count of the window Redis last
// reported weighs its own count (the instance's 1/n share of it).
type weightedLog struct {
	at  []int64
	w   []int64
	sum int64
}

func (l *weightedLog) add(at, w int64) {
	i := sort.Search(len(l.at), func(i int) bool { return l.at[i] > at })
	l.at = append(l.at, 0)
	l.w = append(l.w, 0)
	copy(l.at[i+1:], l.at[i:])
	copy(l.w[i+1:], l.w[i:])
	l.at[i], l.w[i] = at, w
	l.sum += w
}

func (l *weightedLog) trim(now, window int64) {
	i := 0
	for i < len(l.at) && l.at[i] <= now-window {
		l.sum -= l.w[i]
		i++
	}
	l.at, l.w = l.at[i:], l.w[i:]
}

// decide admits cost units weighing n each under limit lim (sub-units).
func (l *weightedLog) decide(now, lim, window, n, cost int64) [core.ReplyLen]int64 {
	l.trim(now, window)
	need := cost * n
	if l.sum+need <= lim {
		l.add(now, need)
		return [core.ReplyLen]int64{1, (lim - l.sum) / n, 0, window, now}
	}
	// Wait until enough weight leaves the window; a cost above the share
	// never fits locally, so it is told to wait a window.
	retry := window
	left := l.sum
	for i := range l.at {
		left -= l.w[i]
		if left+need <= lim {
			retry = l.at[i] + window - now
			break
		}
	}
	reset := int64(0)
	if len(l.at) > 0 {
		reset = l.at[len(l.at)-1] + window - now
	}
	return [core.ReplyLen]int64{0, max(lim-l.sum, 0) / n, max(retry, 0), max(reset, 0), now}
}

package slidingwindow

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var _ driver.Leaser = algorithm{}

// Observe reads a decision's reply as the units in the window and the time
// of the newest: the reply's time for an admission, and for a denial the
// time the window's newest unit leaves it, less a window. The reply alone
// tells it: what was known before is not needed.
func (algorithm) Observe(p core.Policy, _ driver.Seed, _ int64, r driver.Reply) driver.Seed {
	newest := r.Now
	if !r.Allowed {
		newest = r.Now + r.ResetAfter - p.Interval().Microseconds()
	}
	return driver.Seed{Value: p.Limit() - r.Remaining, At: newest}
}

// NewLease starts a lease that carries the known units, as one weight at
// the newest's time, while that time is still in the window.
func (algorithm) NewLease(p core.Policy, seed driver.Seed, now int64) driver.Lease {
	l := &lease{}
	if seed.At > 0 && seed.At > now-p.Interval().Microseconds() {
		l.add(seed.At, seed.Value)
	}
	return l
}

// LoadLease decodes AppendBinary's count and (time, weight) pairs.
func (algorithm) LoadLease(_ core.Policy, data []byte) (driver.Lease, error) {
	bad := fmt.Errorf("%w: sliding window lease: truncated or bad bytes", core.ErrMalformedReply)
	next := func() (int64, bool) {
		x, n := binary.Varint(data)
		if n <= 0 {
			return 0, false
		}
		data = data[n:]
		return x, true
	}
	count, ok := next()
	if !ok || count < 0 || count > int64(len(data)) {
		return nil, bad
	}
	l := &lease{}
	for range count {
		at, ok1 := next()
		w, ok2 := next()
		if !ok1 || !ok2 {
			return nil, bad
		}
		l.add(at, w)
	}
	if len(data) != 0 {
		return nil, bad
	}
	return l, nil
}

// lease is a sliding window counted in sub-units: one local unit weighs n
// (the instance count) against a limit of L, so an instance admits L/n
// units per window; the carried-in count of the window Redis last reported
// weighs its own count (the instance's 1/n share of it).
type lease struct {
	at  []int64
	w   []int64
	sum int64
}

func (l *lease) add(at, w int64) {
	i := sort.Search(len(l.at), func(i int) bool { return l.at[i] > at })
	l.at = append(l.at, 0)
	l.w = append(l.w, 0)
	copy(l.at[i+1:], l.at[i:])
	copy(l.w[i+1:], l.w[i:])
	l.at[i], l.w[i] = at, w
	l.sum += w
}

func (l *lease) trim(now, window int64) {
	i := 0
	for i < len(l.at) && l.at[i] <= now-window {
		l.sum -= l.w[i]
		i++
	}
	l.at, l.w = l.at[i:], l.w[i:]
}

// Decide admits cost units weighing n each under the limit max(L, n)
// (sub-units).
func (l *lease) Decide(p core.Policy, n, now, cost int64) driver.Reply {
	window := p.Interval().Microseconds()
	lim := max(p.Limit(), n)
	l.trim(now, window)
	need := cost * n
	if l.sum+need <= lim {
		l.add(now, need)
		return driver.Reply{Allowed: true, Remaining: (lim - l.sum) / n, ResetAfter: window, Now: now}
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
	return driver.Reply{Remaining: max(lim-l.sum, 0) / n, RetryAfter: max(retry, 0), ResetAfter: max(reset, 0), Now: now}
}

func (l *lease) Charge(p core.Policy, n, at, cost int64) {
	l.trim(at, p.Interval().Microseconds())
	l.add(at, cost*n)
}

func (l *lease) AppendBinary(b []byte) []byte {
	b = binary.AppendVarint(b, int64(len(l.at)))
	for i := range l.at {
		b = binary.AppendVarint(b, l.at[i])
		b = binary.AppendVarint(b, l.w[i])
	}
	return b
}

func (l *lease) Size() int64 { return 56 + 16*int64(cap(l.at)) }

package slidingcounter

import (
	"encoding/binary"
	"fmt"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var _ driver.Leaser = algorithm{}

// A counter's seed holds more than one reply tells. Value's low 32 bits
// are the estimate at the seed's time (Limit − Remaining); bits 32 to 61
// the least a window held, by the reply and the ones before it; bit 62
// which window: set, the seed time's own; clear, the one before it. A seed
// that knows nothing of either window is its estimate alone, the upper
// bits 0.
const (
	seedCount = 1<<30 - 1 // the least count's mask, after the shift of 32
	seedOwn   = 1 << 62   // the least count is of the seed time's window
)

func packSeed(estimate, least int64, own bool) int64 {
	v := estimate | min(least, seedCount)<<32
	if own {
		v |= seedOwn
	}
	return v
}

func unpackSeed(v int64) (estimate, least int64, own bool) {
	return v & (1<<32 - 1), v >> 32 & seedCount, v&seedOwn != 0
}

// Observe reads a decision's reply as the units the counter estimated in
// the window at the reply's time, Limit − Remaining (rounded up as the
// decision rounds it), with the least the window before held, which the
// earlier replies tell (known). The estimate mixes two counts, the current
// window's and the previous window's weighted part, and a lease needs them
// apart: taken whole as the current count, the weighted part would never
// decay, and a lease begun early in a window would admit nothing more in
// it (a Redis kill half-way through a window of 20 a second lost 9 of the
// 19 units the counter gives a window).
//
// What the replies tell of a window's count c, which only grows:
//   - a reply of that window leaves c at least its estimate less the most
//     the window before may weigh then — 2 × Limit (the counts the script
//     reads at most) × the time left ÷ the window, a unit or two for a busy
//     key, whose last reply in a window comes near its end;
//   - a denial told to retry in a later window says that the window's count
//     alone keeps the cost out: c ≥ Limit − cost (when 2 × Limit ≤ the
//     window in µs, so that the previous window's weight has a µs left to
//     shrink through). A key that spent its window early (a fresh key, a
//     burst) gets nothing but such denials till the window ends.
//
// The least count of the reply's own window is kept when a denial tells
// it (the lease then counts the whole estimate as current, as it cannot
// split it); otherwise the seed carries the least count of the window
// before, from known.
func (algorithm) Observe(p core.Policy, known driver.Seed, cost int64, r driver.Reply) driver.Seed {
	lim, w := p.Limit(), p.Interval().Microseconds()
	k := r.Now / w
	var before, own int64
	if known.At > 0 {
		est, least, isOwn := unpackSeed(known.Value)
		switch known.At / w {
		case k:
			if isOwn {
				own = least
			} else {
				before = least
			}
		case k - 1:
			left := k*w - known.At
			before = max(est-(2*lim*left+w-1)/w, 0)
			if isOwn {
				before = max(before, least)
			}
		}
	}
	if !r.Allowed && r.Now+r.RetryAfter >= (k+1)*w && 2*lim <= w {
		own = max(own, lim-max(cost, 1))
	}
	est := min(max(lim-r.Remaining, 0), lim)
	if own > 0 {
		return driver.Seed{Value: packSeed(est, own, true), At: r.Now}
	}
	return driver.Seed{Value: packSeed(est, before, false), At: r.Now}
}

// NewLease starts a lease whose counter holds the known units in sub-units
// (the instance's 1/n share of them), split between the windows: the least
// the window before seed.At held as its previous count, and the rest of the
// estimate as the count of seed.At's window (all of it when the seed knows
// nothing of the window before). The current count is at least the true
// one (the previous window weighed at least that much at seed.At), and the
// estimate it makes from then on at least the true estimate, whose
// previous part decays as fast or faster; they are gone two windows later,
// as in the shared counter.
func (algorithm) NewLease(p core.Policy, seed driver.Seed, _ int64) driver.Lease {
	l := &lease{}
	est, before, own := unpackSeed(seed.Value)
	if own {
		before = 0
	}
	before = min(before, p.Limit()) // a count the decisions made: × a window's µs, below 2^50
	if seed.At > 0 && (est > 0 || before > 0) {
		w := p.Interval().Microseconds()
		k := seed.At / w
		left := (k+1)*w - seed.At
		l.st, l.ok = State{Window: k, Cur: max(est-before*left/w, 0), Prev: before}, true
	}
	return l
}

// LoadLease decodes AppendBinary's five varints: window, current and
// previous counts, whether the lease holds a counter, and the carry.
func (algorithm) LoadLease(_ core.Policy, data []byte) (driver.Lease, error) {
	var v [5]int64
	for i := range v {
		x, n := binary.Varint(data)
		if n <= 0 {
			return nil, fmt.Errorf("%w: sliding window counter lease: truncated", core.ErrMalformedReply)
		}
		v[i], data = x, data[n:]
	}
	if len(data) != 0 || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || v[3] > 1 || v[4] < 0 {
		return nil, fmt.Errorf("%w: sliding window counter lease: trailing or bad bytes", core.ErrMalformedReply)
	}
	return &lease{st: State{Window: v[0], Cur: v[1], Prev: v[2]}, ok: v[3] == 1, carry: v[4]}, nil
}

// lease is one instance's 1/n share of a counter, counted in sub-units: a
// unit weighs n against a limit of Limit sub-units (or n, so that a policy
// smaller than the instance count still admits during an outage), so an
// instance admits Limit/n units a window; the carried-in count weighs its
// own count.
//
// Fractions are kept (carry). While the previous window weighs anything,
// the estimate stays above the window's count, so its last sub-unit never
// fits: the shared counter admits Limit − 1 a window to a client asking
// all the time, one unit less than the limit. A lease loses that sub-unit
// too, but admits whole units of n sub-units, so it loses up to n − 1 more
// — with n instances up to n(n − 1) sub-units, n − 1 of the shared
// counter's units, a window: a 20-a-second policy over 4 instances admitted
// 16 a window where the counter admits 19. The lease carries that room
// (what its estimate still had at the window's end, under one unit) into
// the next window, where its estimate may exceed the limit by it; the
// window's own count never exceeds the limit. Over the windows the leases
// then admit the counter's Limit − 1 a window (20 a second over 4
// instances: 5, 5, 5, 4 units each, 19 a window); at any moment their
// estimate is above the limit by less than a unit of each lease.
type lease struct {
	st    State
	ok    bool
	carry int64 // sub-units of room carried into st.Window, below one unit
}

// at is the lease's counter and carry as of window j, for n instances and
// a limit of lim sub-units.
func (l *lease) at(j, lim, n int64) (State, int64) {
	if !l.ok {
		return State{Window: j}, 0
	}
	s, b := l.st, min(l.carry, n-1)
	for s.Window < j {
		if s.Cur == 0 && s.Prev == 0 {
			// Empty: a window of it carries all it may.
			return State{Window: j}, n - 1
		}
		s, b = s.Roll(s.Window+1), carry(s, lim, b, n)
	}
	return s, b
}

// Decide decides as the script does on sub-units, with the carry, and
// reports remaining units of the share. A cost above the share never fits:
// it is told to retry after a window.
func (l *lease) Decide(p core.Policy, n, now, cost int64) driver.Reply {
	n = max(n, 1)
	w := p.Interval().Microseconds()
	lim := max(p.Limit(), n)
	st, b := l.at(now/w, lim, n)
	s, admit, remaining, retry, reset := decide(st, true, now, lim, w, cost*n, n, b)
	if admit {
		l.st, l.ok, l.carry = s, true, b
	}
	if !admit && cost*n > lim {
		retry = w
	}
	return driver.Reply{Allowed: admit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset, Now: now}
}

// Charge counts cost units at time at in the window they fall in, as a
// replay counts a grant: beyond the limit if need be, and not at all when
// that window is already older than the one before the lease's.
func (l *lease) Charge(p core.Policy, n, at, cost int64) {
	n = max(n, 1)
	w := p.Interval().Microseconds()
	st, b := l.at(at/w, max(p.Limit(), n), n)
	if s, ok := st.count(at/w, cost*n); ok {
		l.st, l.ok, l.carry = s, true, b
	}
}

func (l *lease) AppendBinary(b []byte) []byte {
	ok := int64(0)
	if l.ok {
		ok = 1
	}
	b = binary.AppendVarint(b, l.st.Window)
	b = binary.AppendVarint(b, l.st.Cur)
	b = binary.AppendVarint(b, l.st.Prev)
	b = binary.AppendVarint(b, ok)
	return binary.AppendVarint(b, l.carry)
}

func (l *lease) Size() int64 { return 40 }

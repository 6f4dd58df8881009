package slidingcounter

import (
	"encoding/binary"
	"fmt"

	"github.com/holdfast/holdfast/core"
)

var _ core.Leaser = algorithm{}

// Observe reads a decision's reply as the units the counter estimated in
// the window at the reply's time: Limit − Remaining, rounded up as the
// decision rounds it. A lease or a replay counts them in the fixed window of
// that time, which is conservative: the part from the previous window would
// have weighed less as that window slid away.
func (algorithm) Observe(p core.Policy, r core.Reply) core.Seed {
	return core.Seed{Value: max(p.Limit()-r.Remaining, 0), At: r.Now}
}

// NewLease starts a lease whose counter holds the known units (seed.Value
// sub-units, the instance's 1/n share of them) in the window of seed.At;
// they are gone two windows later, as in the shared counter.
func (algorithm) NewLease(p core.Policy, seed core.Seed, _ int64) core.Lease {
	l := &lease{}
	if seed.At > 0 && seed.Value > 0 {
		l.st, l.ok = State{Window: seed.At / p.Interval().Microseconds(), Cur: seed.Value}, true
	}
	return l
}

// LoadLease decodes AppendBinary's four varints: window, current and
// previous counts, and whether the lease holds a counter.
func (algorithm) LoadLease(_ core.Policy, data []byte) (core.Lease, error) {
	var v [4]int64
	for i := range v {
		x, n := binary.Varint(data)
		if n <= 0 {
			return nil, fmt.Errorf("%w: sliding window counter lease: truncated", core.ErrMalformedReply)
		}
		v[i], data = x, data[n:]
	}
	if len(data) != 0 || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || v[3] > 1 {
		return nil, fmt.Errorf("%w: sliding window counter lease: trailing or bad bytes", core.ErrMalformedReply)
	}
	return &lease{st: State{Window: v[0], Cur: v[1], Prev: v[2]}, ok: v[3] == 1}, nil
}

// lease is one instance's 1/n share of a counter, counted in sub-units: a
// unit weighs n against a limit of Limit sub-units (or n, so that a policy
// smaller than the instance count still admits during an outage), so an
// instance admits Limit/n units a window, fractions kept, as the sliding
// window's lease does; the carried-in count weighs its own count.
type lease struct {
	st State
	ok bool
}

// Decide decides as the script does on sub-units, and reports remaining
// units of the share. A cost above the share never fits: it is told to
// retry after a window.
func (l *lease) Decide(p core.Policy, n, now, cost int64) core.Reply {
	n = max(n, 1)
	w := p.Interval().Microseconds()
	lim := max(p.Limit(), n)
	s, admit, remaining, retry, reset := decide(l.st, l.ok, now, lim, w, cost*n, n)
	if admit {
		l.st, l.ok = s, true
	}
	if !admit && cost*n > lim {
		retry = w
	}
	return core.Reply{Allowed: admit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset, Now: now}
}

// Charge counts cost units at time at in the window they fall in, as a
// replay counts a grant: beyond the limit if need be, and not at all when
// that window is already older than the one before the lease's.
func (l *lease) Charge(p core.Policy, n, at, cost int64) {
	w := p.Interval().Microseconds()
	s := State{Window: at / w}
	if l.ok {
		s = l.st.Roll(s.Window)
	}
	if s, ok := s.count(at/w, cost*max(n, 1)); ok {
		l.st, l.ok = s, true
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
	return binary.AppendVarint(b, ok)
}

func (l *lease) Size() int64 { return 32 }

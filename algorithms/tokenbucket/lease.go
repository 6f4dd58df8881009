package tokenbucket

import (
	"encoding/binary"
	"fmt"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var _ driver.Leaser = algorithm{}

// Observe reads a decision's reply as the bucket's credit at the reply's
// time: a full bucket's credit less the time until it is full again. The
// reply alone tells it: what was known before is not needed.
func (algorithm) Observe(p core.Policy, _ driver.Seed, _ int64, r driver.Reply) driver.Seed {
	return driver.Seed{Value: p.Limit()*p.Interval().Microseconds() - r.ResetAfter, At: r.Now}
}

// NewLease starts a lease from the known credit (seed.Value µs at seed.At),
// or from a full bucket when nothing is known.
func (algorithm) NewLease(_ core.Policy, seed driver.Seed, _ int64) driver.Lease {
	return &lease{st: State{Credit: seed.Value, Last: seed.At}, ok: seed.At > 0}
}

// LoadLease decodes AppendBinary's three varints.
func (algorithm) LoadLease(_ core.Policy, data []byte) (driver.Lease, error) {
	var v [3]int64
	for i := range v {
		x, n := binary.Varint(data)
		if n <= 0 {
			return nil, fmt.Errorf("%w: token bucket lease: truncated", core.ErrMalformedReply)
		}
		v[i], data = x, data[n:]
	}
	if len(data) != 0 || v[2] < 0 || v[2] > 1 {
		return nil, fmt.Errorf("%w: token bucket lease: trailing or bad bytes", core.ErrMalformedReply)
	}
	return &lease{st: State{Credit: v[0], Last: v[1]}, ok: v[2] == 1}, nil
}

// lease is one instance's share of a bucket: credit is shared in
// microseconds, so a token costs n·T locally and a full local bucket holds
// C·T, or one token when C < n.
type lease struct {
	st State
	ok bool
}

// Decide is DecideCredit on the lease's share, with the reply built from
// decide's scalars: an array result is returned through memory, where
// these stay in registers (this is every local decision's path).
func (l *lease) Decide(p core.Policy, n, now, cost int64) driver.Reply {
	t := p.Interval().Microseconds()
	full := max(p.Limit(), n) * t
	credit, admit, remaining, retry := decide(l.st, l.ok, now, full, n*t, cost)
	if admit {
		l.st, l.ok = State{Credit: credit, Last: now}, true
	}
	return driver.Reply{Allowed: admit, Remaining: remaining, RetryAfter: retry, ResetAfter: full - credit, Now: now}
}

func (l *lease) Charge(p core.Policy, n, at, cost int64) {
	t := p.Interval().Microseconds()
	full := max(p.Limit(), n) * t
	credit := full
	if l.ok {
		credit = l.st.At(at, full)
	}
	l.st, l.ok = State{Credit: credit - cost*n*t, Last: at}, true
}

func (l *lease) AppendBinary(b []byte) []byte {
	ok := int64(0)
	if l.ok {
		ok = 1
	}
	b = binary.AppendVarint(b, l.st.Credit)
	b = binary.AppendVarint(b, l.st.Last)
	return binary.AppendVarint(b, ok)
}

func (l *lease) Size() int64 { return 24 }

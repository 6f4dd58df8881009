package slidingcounter

import "github.com/holdfast/holdfast/core"

// Known is the state a decision's reply r reports for policy p, for
// implementers of the fallback layer: Value is the units the counter
// estimated in the window (Limit − Remaining, rounded up as the decision
// rounds it), At the reply's store time. It seeds a lease (Lease.Start) and
// a replay into a key Redis lost (core.Batch.Seed). Counting the whole
// estimate in the window of At is conservative: its previous window's part
// would have been weighed less as that window slid away.
func Known(p core.Policy, r core.Reply) core.Seed {
	return core.Seed{Value: max(p.Limit()-r.Remaining, 0), At: r.Now}
}

// A Lease is one instance's share of a sliding window counter policy while
// the shared store is out of reach, for implementers of the fallback layer.
// With n instances each enforces 1/n of the policy: a unit weighs n
// sub-units against a limit of Limit sub-units (or n, so that a policy
// smaller than the instance count still admits during an outage),
// fractions kept; the count
// carried in from the known state weighs its own count, the instance's 1/n
// share of it. The zero Lease is a fresh counter. A Lease is not safe for
// concurrent use.
type Lease struct {
	st State
	ok bool
}

// Start begins the lease of policy p from the known state (Known; the zero
// Seed when nothing is known): its units count in the window of its time.
func (l *Lease) Start(p core.Policy, known core.Seed) {
	*l = Lease{}
	if known.At > 0 && known.Value > 0 {
		l.st, l.ok = State{Window: known.At / p.Interval().Microseconds(), Cur: known.Value}, true
	}
}

// State is the lease's counter, in sub-units, and whether it holds one.
func (l *Lease) State() (State, bool) { return l.st, l.ok }

// Decide decides cost units of policy p at now (microseconds, store time)
// under the lease's 1/n share, and reports it in units of the share: the
// same reply the decision script gives, for a limit of Limit/n. A cost above
// the share never fits: it is told to retry after a window.
func (l *Lease) Decide(p core.Policy, n, now, cost int64) core.Reply {
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

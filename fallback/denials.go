package fallback

import (
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// denial is a Redis denial remembered for its key: while no instance can add
// quota (instances only spend it), the key stays denied for this cost or any
// higher one until the retry time Redis gave. The retry time is counted from
// when the call was sent, which is no later than when Redis decided, so the
// memory never outlives the denial Redis would give.
type denial struct {
	limit    int64
	interval time.Duration
	cost     int64
	until    int64 // local clock, UnixNano
	reset    int64 // local clock, UnixNano: when the key is full again
	left     int64 // Remaining in the denial
}

// remember records a denial sent at sent (local clock), and returns when
// it ends (denial.until; 0 for an admission, which forgets the last).
func (k *keyState) remember(p core.Policy, cost int64, sent time.Time, r driver.Reply) (until int64) {
	if r.Allowed {
		k.deny = denial{}
		return 0
	}
	k.deny = denial{
		limit: p.Limit(), interval: p.Interval(), cost: cost,
		until: sent.UnixNano() + r.RetryAfter*int64(time.Microsecond),
		reset: sent.UnixNano() + r.ResetAfter*int64(time.Microsecond),
		left:  r.Remaining,
	}
	return k.deny.until
}

// recall answers a request from a remembered denial, if one covers it.
func (k *keyState) recall(p core.Policy, cost int64, now time.Time) (core.Result, bool) {
	d := k.deny
	t := now.UnixNano()
	if d.until <= t || cost < d.cost || d.limit != p.Limit() || d.interval != p.Interval() {
		return core.Result{}, false
	}
	return core.Result{
		Limit:      p.Limit(),
		Remaining:  d.left,
		RetryAfter: time.Duration(d.until - t),
		ResetAfter: time.Duration(max(d.reset-t, 0)),
	}, true
}

// recalled looks up a remembered denial of key for this request.
func (l *cell) recalled(p core.Policy, key string, cost int64) (core.Result, bool) {
	var r core.Result
	var ok bool
	now := l.o.Clock()
	if now.UnixNano() >= l.denyUntil.Load() {
		// Every denial remembered has ended (recall's until <= now): no
		// lookup. A cell that has denied nothing lately pays one clock read.
		return r, false
	}
	l.leases.UpdateParts(l.o.Prefix, p.Name(), key, func(prev any, _ int64) (any, int64) {
		if ks, _ := prev.(*keyState); ks != nil {
			r, ok = ks.recall(p, cost, now)
		}
		return prev, -1
	})
	r.Mode = l.sharedMode
	return r, ok
}

package fallback

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Peek, Reset and AllowAll on the fallback limiter: the same operations as
// core.Limiter's, through Redis while the breaker is closed and on the
// instance's own share while it is not.

var _ core.MultiDecider = (*Limiter)(nil)

// cellOf is the Limiter that decides key under p: a Cluster shard's cell,
// or l.
func (l *Limiter) cellOf(p core.Policy, key string) *cell {
	if set := l.shards.Load(); set != nil {
		if c := set.cellFor(l.o.Prefix, p.Name(), key); c != nil {
			return c
		}
	}
	return l.cell
}

// call runs one script call through the store under the breaker's call
// deadline (carried in Redis time by a guarded script once the offset is
// known), in breaker generation gen, and reports the outcome to the
// breaker as a decision's is.
func (l *cell) call(ctx context.Context, gen uint64, sc *driver.Script, keys, args []string) ([]int64, error) {
	timeout := l.breaker.CallTimeout()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	start := l.o.Clock()
	if d, ok := l.deadline(start, timeout); ok && sc.Guarded() {
		args = append(args[:len(args):len(args)], d)
	}
	raw, err := l.store.Run(cctx, sc, keys, args)
	took := l.o.Clock().Sub(start)
	cancel()
	switch {
	case err == nil:
		l.breaker.Done(gen, nil, took)
		return raw, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case core.ClassOf(err) == core.ClassRequest:
		l.breaker.Done(gen, nil, took)
		return nil, err
	}
	l.storeFailed(gen, err, took)
	return nil, err
}

// Peek returns what AllowN(ctx, p, key, cost) would answer now, spending
// nothing: Redis's answer while the breaker is closed, else the answer of
// the policy's outage mode (with Leases, of this instance's lease).
func (l *Limiter) Peek(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error) {
	if ctx == nil {
		return core.Result{}, core.ErrNilContext
	}
	if err := driver.CheckRequest(p, key, cost); err != nil {
		return core.Result{}, err
	}
	if err := l.usable(); err != nil {
		return core.Result{}, err
	}
	pk, ok := p.Algorithm().(driver.Peeker)
	if !ok {
		return core.Result{}, driver.Errorf(core.ErrInvalidPolicy, "algorithm %s cannot peek", p.Algorithm().Name())
	}
	return l.cellOf(p, key).peek(ctx, pk, p, key, cost)
}

func (l *cell) peek(ctx context.Context, pk driver.Peeker, p core.Policy, key string, cost int64) (core.Result, error) {
	if gen, closed := l.breaker.Allow(); closed {
		var id string
		if p.Algorithm().NeedsID() {
			id = l.o.NewID()
		}
		skey := driver.StorageKey(l.o.Prefix, p.Name(), key)
		start := l.o.Clock()
		raw, err := l.call(ctx, gen, pk.PeekScript(), []string{skey}, p.Algorithm().Args(p, cost, id, 0))
		if err == nil {
			var rep driver.Reply
			if rep, err = driver.ParseReply(raw); err == nil {
				// The reply is Redis's view of the key now, as a decision's
				// is: it becomes the known state, so a lease started after
				// it begins there. An admitting peek reads as if it had
				// spent its cost (a known state that errs towards denying).
				l.observe(skey, p, cost, start, rep)
				return core.ResultOf(p.Limit(), rep, l.sharedMode, false), nil
			}
		}
		if core.ClassOf(err) == core.ClassRequest || ctx.Err() != nil {
			return core.Result{}, err
		}
	}
	return l.localPeek(p, key, cost), nil
}

// outageMode is p's outage mode.
func (l *cell) outageMode(p core.Policy) OutageMode {
	if len(l.o.OutageModes) == 0 {
		return Leases
	}
	return l.o.OutageModes[p.Name()]
}

// localPeek is what local would answer now, spending nothing: with Leases,
// the decision of a copy of the key's lease.
func (l *cell) localPeek(p core.Policy, key string, cost int64) core.Result {
	switch l.outageMode(p) {
	case FailClosed:
		return core.Result{Limit: p.Limit(), RetryAfter: l.breaker.ProbeInterval(), Mode: core.ModeFailClosed, Degraded: true}
	case FailOpen:
		return core.Result{Allowed: true, Limit: p.Limit(), Remaining: p.Limit(), Mode: core.ModeFailOpen, Degraded: true}
	}
	n := l.instances.Load()
	var rep driver.Reply
	l.leases.UpdateParts(l.o.Prefix, p.Name(), key, func(prev any, now int64) (any, int64) {
		var cp keyState
		if ks, _ := prev.(*keyState); ks != nil {
			cp = *ks
			if cp.lease != nil {
				cp.lease = cloneLease(p, cp.lease)
			}
		}
		cp.decideLease(p, n, now, cost, &rep)
		return prev, -1 // the copy is dropped: nothing spent
	})
	return core.ResultOf(share(p.Limit(), n), rep, core.ModeLocal, true)
}

// cloneLease is a copy of lease, through its encoding: nil when it cannot
// be read back (then decideLease starts a new one, from the known state).
func cloneLease(p core.Policy, lease driver.Lease) driver.Lease {
	lr, ok := p.Algorithm().(driver.Leaser)
	if !ok {
		return nil
	}
	c, err := lr.LoadLease(p, lease.AppendBinary(nil))
	if err != nil {
		return nil
	}
	return c
}

// resetOnceScript deletes KEYS[1] unless the marker KEYS[2] says this reset
// was applied already: a reset made during an outage and retried after a
// lost reply deletes what other instances replayed since only once.
var resetOnceScript = driver.NewScript("reset_once", `
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0}`, func(any, int64, []string) (any, []int64, int64, error) { return nil, []int64{1}, 0, nil })

// resetMarkerTTL is how long a pending reset's marker lives: past any
// retry of it.
const resetMarkerTTL = 10 * time.Minute

// pendingResets are the resets made while Redis could not take them, by
// storage key, each with the id of its marker: applied once, before the
// outage log is replayed.
type pendingResets struct {
	mu   sync.Mutex
	keys map[string]string
}

func (r *pendingResets) add(skey, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = make(map[string]string)
	}
	r.keys[skey] = id
}

func (r *pendingResets) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys)
}

// Reset forgets key's usage of policy p: its next request finds a full
// quota. Through Redis while the breaker is closed. During an outage the
// instance's own lease starts again from a full share, the grants of key
// that this instance logged and has not replayed are dropped (the reset
// forgives them), and the reset is applied in Redis when it returns,
// once, before this instance replays what it granted after the reset.
// Grants another instance replays before that are reset too; those it
// replays after it count.
func (l *Limiter) Reset(ctx context.Context, p core.Policy, key string) error {
	if ctx == nil {
		return core.ErrNilContext
	}
	if err := driver.CheckRequest(p, key, 1); err != nil {
		return err
	}
	if err := l.usable(); err != nil {
		return err
	}
	return l.cellOf(p, key).reset(ctx, p, key)
}

func (l *cell) reset(ctx context.Context, p core.Policy, key string) error {
	skey := driver.StorageKey(l.o.Prefix, p.Name(), key)
	// Under the replay's lock: no batch of the key is in flight while its
	// grants are dropped and the key deleted.
	l.reconMu.Lock()
	defer l.reconMu.Unlock()
	l.log.drop(skey)
	l.leases.Update(skey, func(any, int64) (any, int64) { return nil, 0 })
	id := l.log.nextID()
	if l.jnl != nil {
		// The state dir forgets the key too; a restart keeps the reset.
		l.jnl.reset(recReset, skey, id)
	}
	if gen, closed := l.breaker.Allow(); closed {
		_, err := l.call(ctx, gen, driver.ResetScript(), []string{skey}, nil)
		if err == nil || core.ClassOf(err) == core.ClassRequest || ctx.Err() != nil {
			if l.jnl != nil {
				l.jnl.reset(recResetDone, skey, id)
			}
			return err
		}
	}
	l.resets.add(skey, id)
	return nil
}

// applyResets applies the pending resets; reconMu is held. A reset that
// fails stays pending.
func (l *cell) applyResets(ctx context.Context) error {
	l.resets.mu.Lock()
	pend := make(map[string]string, len(l.resets.keys))
	for k, id := range l.resets.keys {
		pend[k] = id
	}
	l.resets.mu.Unlock()
	ttl := strconv.FormatInt(resetMarkerTTL.Milliseconds(), 10)
	for skey, id := range pend {
		cctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
		_, err := l.store.Run(cctx, resetOnceScript, []string{skey, skey + ":reset:" + id}, []string{ttl})
		cancel()
		if err != nil {
			return err
		}
		l.resets.mu.Lock()
		if l.resets.keys[skey] == id {
			delete(l.resets.keys, skey)
		}
		l.resets.mu.Unlock()
		if l.jnl != nil {
			l.jnl.reset(recResetDone, skey, id)
		}
	}
	return nil
}

// A charge is how AllowAll spent one request: through Redis (refunded
// there if another request denies) or pending on the local path (spent
// only once every request has been decided).
type charge struct {
	cell   *cell
	id     string
	rep    driver.Reply
	remote bool
}

// AllowAll charges every request, all or nothing, as core.Limiter's
// AllowAll does: it admits only if each request's policy admits it, and a
// denial by any spends none of the others. Requests whose shard's breaker
// is closed are charged through Redis in order, and refunded there at the
// first denial. Requests decided locally (an outage) apply the same rule
// on this instance's shares: each is checked without spending (Peek's
// local answer), and spent, by its outage mode, only once every request
// has admitted; AllowAll calls of one Limiter take their local decisions
// one at a time, so two of them never both spend the last of a share.
// Each Result is what its policy alone answered (see core.Limiter.AllowAll).
// When every request goes to one cell whose breaker is closed and the store
// pipelines, they are charged in one round trip, and refunded in a second
// when one denies (allowAllPipelined).
// A refund that Redis does not take leaves that charge spent (an
// under-admission, never more admitted).
func (l *Limiter) AllowAll(ctx context.Context, reqs ...core.Request) ([]core.Result, error) {
	if ctx == nil {
		return nil, core.ErrNilContext
	}
	if err := core.CheckRequests(reqs); err != nil {
		return nil, err
	}
	if err := l.usable(); err != nil {
		return nil, err
	}
	if rs, ok, err := l.allowAllPipelined(ctx, reqs); ok {
		return rs, err
	}
	rs := make([]core.Result, len(reqs))
	ch := make([]charge, len(reqs))
	locked := false
	defer func() {
		if locked {
			l.multiMu.Unlock()
		}
	}()
	for i, q := range reqs {
		p, cost := q.Policy, q.Units()
		c := l.cellOf(p, q.Key)
		ch[i].cell = c
		if p.Algorithm().NeedsID() {
			ch[i].id = l.o.NewID()
		}
		r, rep, remote, err := c.chargeRemote(ctx, p, q.Key, cost, ch[i].id)
		if err != nil {
			l.refund(ctx, reqs[:i], ch)
			return nil, err
		}
		if !remote {
			if !locked {
				l.multiMu.Lock()
				locked = true
			}
			r = c.localPeek(p, q.Key, cost)
		}
		rs[i], ch[i].rep, ch[i].remote = r, rep, remote && r.Allowed
		if r.Allowed {
			continue
		}
		l.refund(ctx, reqs[:i], ch)
		for j := i + 1; j < len(reqs); j++ {
			if rs[j], err = l.Peek(ctx, reqs[j].Policy, reqs[j].Key, reqs[j].Units()); err != nil {
				return nil, err
			}
		}
		return rs, nil
	}
	// Every request admits: spend the local ones. One that a concurrent
	// AllowN spent first denies now; the requests before it stay spent
	// (an under-admission), the Redis ones are refunded.
	for i, q := range reqs {
		if ch[i].remote {
			continue
		}
		var r core.Result
		err := ch[i].cell.local(ctx, q.Policy, q.Key, q.Units(), ch[i].id, &r)
		if err != nil || !r.Allowed {
			rs[i] = r
			l.refund(ctx, reqs, ch)
			return rs, err
		}
		rs[i] = r
	}
	return rs, nil
}

// allowAllPipelined is AllowAll in one round trip: when every request goes
// to one cell whose breaker is closed, over a store that pipelines
// (driver.Pipeliner), and no request repeats a remembered denial, it charges
// them all at once and refunds the admitted ones if any denied (in a
// second round trip). Each Result is then its request's own decision. ok
// is false when it does not apply, or when a call failed in the store:
// what it admitted is refunded and the ordered path decides.
func (l *Limiter) allowAllPipelined(ctx context.Context, reqs []core.Request) ([]core.Result, bool, error) {
	c := l.cellOf(reqs[0].Policy, reqs[0].Key)
	for _, q := range reqs[1:] {
		if l.cellOf(q.Policy, q.Key) != c {
			return nil, false, nil
		}
	}
	pl, isPipe := c.store.(driver.Pipeliner)
	if !isPipe {
		return nil, false, nil
	}
	gen, closed := c.breaker.Allow()
	if !closed {
		return nil, false, nil
	}
	if !c.o.NoDenialMemory {
		for _, q := range reqs {
			if _, denied := c.recalled(q.Policy, q.Key, q.Units()); denied {
				return nil, false, nil // the ordered path answers it from memory
			}
		}
	}
	n := len(reqs)
	ch := make([]charge, n)
	calls := make([]driver.Call, n)
	skeys := make([]string, n)
	timeout := c.breaker.CallTimeout()
	start := c.o.Clock()
	deadline, hasDeadline := c.deadline(start, timeout)
	for i, q := range reqs {
		alg := q.Policy.Algorithm()
		ch[i].cell = c
		if alg.NeedsID() {
			ch[i].id = c.o.NewID()
		}
		args := alg.Args(q.Policy, q.Units(), ch[i].id, 0)
		if hasDeadline {
			args = append(args, deadline)
		}
		skeys[i] = driver.StorageKey(c.o.Prefix, q.Policy.Name(), q.Key)
		calls[i] = driver.Call{Script: alg.Script(), Keys: []string{skeys[i]}, Args: args}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	res := pl.RunMany(cctx, calls)
	took := c.o.Clock().Sub(start)
	cancel()
	rs := make([]core.Result, n)
	var storeErr, reqErr error
	denied := false
	for i, r := range res {
		err := r.Err
		if err == nil {
			var rep driver.Reply
			if rep, err = driver.ParseReply(r.Reply); err == nil {
				c.observe(skeys[i], reqs[i].Policy, reqs[i].Units(), start, rep)
				rs[i] = core.ResultOf(reqs[i].Policy.Limit(), rep, c.sharedMode, false)
				ch[i].rep, ch[i].remote = rep, rep.Allowed
				denied = denied || !rep.Allowed
				continue
			}
		}
		if core.ClassOf(err) == core.ClassRequest {
			reqErr = err
		} else {
			storeErr = err
		}
	}
	switch {
	case ctx.Err() != nil:
		// The caller gave up: not the store's fault.
	case storeErr != nil:
		c.storeFailed(gen, storeErr, took)
	default:
		c.breaker.Done(gen, nil, took)
	}
	if storeErr != nil || reqErr != nil || ctx.Err() != nil {
		l.refund(ctx, reqs, ch)
		switch {
		case ctx.Err() != nil:
			return nil, true, ctx.Err()
		case reqErr != nil:
			return nil, true, reqErr
		}
		return nil, false, nil
	}
	if denied {
		l.refund(ctx, reqs, ch)
	}
	return rs, true, nil
}

// chargeRemote decides one request of AllowAll through Redis when its
// breaker is closed: remote is false when Redis did not decide (the breaker
// is not closed, or the call failed) and the request goes to the local
// path. A remembered denial answers without a call.
func (l *cell) chargeRemote(ctx context.Context, p core.Policy, key string, cost int64, id string) (core.Result, driver.Reply, bool, error) {
	gen, closed := l.breaker.Allow()
	if !closed {
		return core.Result{}, driver.Reply{}, false, nil
	}
	if !l.o.NoDenialMemory {
		if r, ok := l.recalled(p, key, cost); ok {
			return r, driver.Reply{}, true, nil
		}
	}
	r, rep, err := l.remote(ctx, gen, p, key, cost, id)
	if err == nil {
		return r, rep, true, nil
	}
	if core.ClassOf(err) == core.ClassRequest || ctx.Err() != nil {
		return core.Result{}, driver.Reply{}, false, err
	}
	return core.Result{}, driver.Reply{}, false, nil
}

// refund gives back the Redis charges among the first requests
// (ch[i].remote), in one round trip when they are all of one cell over a
// store that pipelines. A refund its cell's breaker keeps from Redis (it
// opened since the charge) was never sent: it waits in the cell's pending
// refunds and is applied once when Redis returns, before the outage log's
// replay. A refund whose call fails may have been applied or not; it is
// not sent again, so its charge may stay spent (an under-admission, never
// more admitted): Status.LostRefunds counts them, the breaker counts the
// failure.
func (l *Limiter) refund(ctx context.Context, reqs []core.Request, ch []charge) {
	var calls []driver.Call
	var cells []*cell
	for i, q := range reqs {
		if !ch[i].remote {
			continue
		}
		c := ch[i].cell
		calls = append(calls, q.Policy.Algorithm().(driver.Refunder).RefundCall(q.Policy, driver.StorageKey(l.o.Prefix, q.Policy.Name(), q.Key), q.Units(), ch[i].id, ch[i].rep))
		cells = append(cells, c)
		ch[i].remote = false
	}
	if len(calls) == 0 {
		return
	}
	if pl, ok := cells[0].store.(driver.Pipeliner); ok && len(calls) > 1 && !slices.ContainsFunc(cells, func(c *cell) bool { return c != cells[0] }) {
		c := cells[0]
		gen, closed := c.breaker.Allow()
		if !closed {
			c.refunds.add(calls...)
			return
		}
		start := c.o.Clock()
		cctx, cancel := context.WithTimeout(ctx, c.breaker.CallTimeout())
		res := pl.RunMany(cctx, calls)
		took := c.o.Clock().Sub(start)
		cancel()
		failed := c.refunds.failed(res)
		switch {
		case failed == nil:
			c.breaker.Done(gen, nil, took)
		case ctx.Err() == nil:
			c.storeFailed(gen, failed, took)
		}
		return
	}
	for i, call := range calls {
		c := cells[i]
		gen, closed := c.breaker.Allow()
		if !closed {
			c.refunds.add(call)
			continue
		}
		if _, err := c.call(ctx, gen, call.Script, call.Keys, call.Args); err != nil && core.ClassOf(err) != core.ClassRequest {
			c.refunds.lost.Add(1)
		}
	}
}

// maxPendingRefunds bounds a cell's pending refunds: past it a refund is
// dropped and counted lost (its charge stays spent).
const maxPendingRefunds = 4096

// pendingRefunds are the refund calls a breaker kept from Redis, to apply
// once when it returns, and the count of refunds lost: failed in the store
// or dropped past maxPendingRefunds.
type pendingRefunds struct {
	mu    sync.Mutex
	calls []driver.Call
	lost  atomic.Uint64
}

func (r *pendingRefunds) add(calls ...driver.Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := min(len(calls), maxPendingRefunds-len(r.calls))
	r.calls = append(r.calls, calls[:keep]...)
	r.lost.Add(uint64(len(calls) - keep))
}

func (r *pendingRefunds) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// take empties the pending refunds and returns them.
func (r *pendingRefunds) take() []driver.Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls := r.calls
	r.calls = nil
	return calls
}

// failed counts the refunds of res whose call failed with a store error
// lost (they may have been applied, so they are never sent again) and
// returns the first such error. A refund Redis refused as a request error
// was not applied and is not lost.
func (r *pendingRefunds) failed(res []driver.CallResult) error {
	var first error
	for _, c := range res {
		if c.Err != nil && core.ClassOf(c.Err) != core.ClassRequest {
			r.lost.Add(1)
			first = cmp.Or(first, c.Err)
		}
	}
	return first
}

// refundChunk is how many pending refunds applyRefunds sends in one
// pipeline, each pipeline within the call deadline.
const refundChunk = 256

// applyRefunds sends the pending refunds, each once, pipelined when the
// store pipelines; reconMu is held. A refund whose call fails is not sent
// again (it may have been applied): it is counted lost. At the first
// store failure the refunds not yet sent go back to the pending ones, for
// the next recovery, and the failure is returned: a Redis gone again does
// not hold the recovery a call deadline per refund.
func (l *cell) applyRefunds(ctx context.Context) error {
	calls := l.refunds.take()
	pl, pipelined := l.store.(driver.Pipeliner)
	for len(calls) > 0 {
		n := 1
		if pipelined {
			n = min(len(calls), refundChunk)
		}
		cctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
		var res []driver.CallResult
		if pipelined {
			res = pl.RunMany(cctx, calls[:n])
		} else {
			_, err := l.store.Run(cctx, calls[0].Script, calls[0].Keys, calls[0].Args)
			res = []driver.CallResult{{Err: err}}
		}
		cancel()
		calls = calls[n:]
		if failed := l.refunds.failed(res); failed != nil {
			l.refunds.add(calls...)
			return failed
		}
	}
	return nil
}

package pipeline

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// maxDecisions is the most decisions in one call of a Many script.
const maxDecisions = 128

// Decisions sends a store's decision calls so that the decisions on one
// key that arrive while another on that key is in flight share one call
// of their script's Many (driver.Many). A decision on a key with nothing
// in flight is sent at once, alone, on the caller's goroutine, as the
// store sends any call: a lone caller, and callers on distinct keys, wait
// for their own round trip only, pipelined as the client pipelines. So
// does a decision on a key with one call in flight and none waiting
// (laneDepth). A decision on a key with more in flight waits for a call to
// land; then what waited on the key goes in one call, in the order it
// came. A hot key's concurrent callers so make one call, one read and one
// write of the key a round trip, where each would send its own script.
//
// Decisions on distinct keys share calls too once the store is busy: a
// decision that would be sent at once while Depth decision calls are
// already in flight on the store and KeysFrom decisions are in it (in
// flight or waiting, its own included) waits instead for one of the calls
// to land, and then what waited goes in one call of its script's Keys
// (driver.Many): one EVALSHA for many keys' decisions, where each would
// pay its own. A lone caller, and a few dozen, never wait; many callers on
// many keys send fewer, larger calls, and Redis spends less of its time a
// decision. On a cluster (Cluster) such a call holds the keys of one hash
// slot.
//
// Calls of scripts without a Many, and calls that do not fit theirs
// (driver.Many.Fits), are sent as they come.
//
// A waiting decision whose context ends before its call is sent is not
// sent: its caller gets the context's error, and the store never sees it.
// One whose context ends after it was taken has an unknown outcome, as a
// call abandoned in flight. A decision that has waited StallAfter (a slow
// link, a frozen server) sends what waits on its key at once, in a call
// of its own beside the one in flight, so that a slow round trip does not
// hold decisions a whole round trip before they are even sent.
type Decisions struct {
	// One sends one call, as the store sends a Run call alone.
	One func(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error)
	// Classify maps the error of a decision that ended unsent, as Run
	// maps errors.
	Classify func(name string, err error) error
	// StallAfter is how long a decision waits on a key's call in flight
	// before it is sent beside it; 0 means DefaultStallAfter.
	StallAfter time.Duration
	// Depth is how many decision calls may be in flight on the store
	// before the decisions that would be sent alone wait to share a call
	// of several keys; 0 or less sends no call of several keys (as for a
	// client that does not route a call by its first key, such as a
	// client-side sharded ring). The stores choose it (goredis,
	// rueidis StoreOptions.KeysDepth).
	Depth int
	// KeysFrom is how many decisions must be in the store at once, in
	// flight or waiting, before any waits to share a call of several
	// keys; 0 means DefaultKeysFrom. Below it every decision on a key
	// without a call in flight is sent at once, as with Depth 0: the wait
	// for a call to land costs a few callers more than the shared call
	// saves them.
	KeysFrom int
	// Cluster makes a call of several keys hold keys of one hash slot
	// (driver.HashSlot) only.
	Cluster bool

	mu       sync.Mutex
	lanes    map[string]*lane // keys with a call in flight
	inflight int              // decision calls in flight, of every kind
	active   atomic.Int64     // Run calls of decisions in progress, sent or waiting
	queue    []*decision      // decisions waiting for a call of several keys

	calls, batched  atomic.Int64 // Many calls sent and the decisions in them
	keyCalls, keyed atomic.Int64 // calls of several keys sent and the decisions in them
}

// Batched returns the number of Many calls sent and of the decisions they
// carried.
func (d *Decisions) Batched() (calls, decisions int64) { return d.calls.Load(), d.batched.Load() }

// Keyed returns the number of calls of several keys sent and of the
// decisions they carried.
func (d *Decisions) Keyed() (calls, decisions int64) { return d.keyCalls.Load(), d.keyed.Load() }

// A lane is a key with a call in flight, and the decisions waiting on it.
type lane struct {
	waiting  []*decision
	inflight int // calls in flight on the key
}

var lanePool = sync.Pool{New: func() any { return new(lane) }}

// Decision states. A waiting decision is queued; a call takes it, or its
// caller gives it up (gone), never both. A taken decision's caller may be
// chosen to lead the call (leading), or give it up, never both: a caller
// that gives up never leaves a call unsent.
const (
	queued int32 = iota
	taken
	leading
	gone
)

// A decision is one waiting Run call. Its caller reuses it only once it
// has received the outcome.
type decision struct {
	ctx   context.Context
	sc    *driver.Script
	key   string
	args  []string // a copy
	state atomic.Int32
	batch []*decision // the call it leads (errLead)
	keys  bool        // it waits in Decisions.queue, for a call of several keys
	slot  int         // its key's hash slot, on a cluster (Decisions.Cluster)
	stall *time.Timer
	done  chan driver.CallResult // buffered: a flight never waits for the caller
}

var decisionPool = sync.Pool{New: func() any {
	w := &decision{done: make(chan driver.CallResult, 1), stall: time.NewTimer(time.Hour)}
	w.stall.Stop()
	return w
}}

// Run runs sc on keys and args, as the store's Run. It does not keep keys
// or args after it returns.
func (d *Decisions) Run(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	m := sc.Many()
	if m == nil || len(keys) != 1 || !m.Fits(args) {
		return d.One(ctx, sc, keys, args)
	}
	key := keys[0]
	busy := d.active.Add(1) >= int64(cmp.Or(d.KeysFrom, DefaultKeysFrom))
	defer d.active.Add(-1)
	d.mu.Lock()
	ln := d.lanes[key]
	alone := ln == nil || ln.inflight < laneDepth && len(ln.waiting) == 0
	if alone && (m.Keys == nil || d.Depth <= 0 || d.inflight < d.Depth || !busy) {
		if ln == nil {
			if d.lanes == nil {
				d.lanes = map[string]*lane{}
			}
			ln = lanePool.Get().(*lane)
			d.lanes[key] = ln
		}
		ln.inflight++
		d.inflight++
		d.mu.Unlock()
		r, err := d.One(ctx, sc, keys, args)
		d.landed(key)
		return r, err
	}
	if err := ctx.Err(); err != nil {
		d.mu.Unlock()
		return nil, d.Classify(sc.Name(), err)
	}
	w := decisionPool.Get().(*decision)
	w.ctx, w.sc, w.key, w.keys, w.slot = ctx, sc, key, alone, 0
	w.args = append(w.args[:0], args...)
	w.state.Store(queued)
	if alone {
		// The store is busy: w waits for a call of several keys.
		if d.Cluster {
			w.slot = driver.HashSlot(key)
		}
		d.queue = append(d.queue, w)
	} else {
		ln.waiting = append(ln.waiting, w)
	}
	d.mu.Unlock()
	w.stall.Reset(cmp.Or(d.StallAfter, DefaultStallAfter))
	for {
		select {
		case <-w.stall.C:
			if alone {
				d.kickKeys()
			} else {
				d.kick(key)
			}
			continue
		case r := <-w.done:
			w.stall.Stop()
			if r.Err == errLead {
				// This caller sends the next call, its own decision in it.
				d.leadAny(w)
				continue
			}
			clear(w.args)
			w.ctx, w.sc, w.key, w.batch, w.keys = nil, nil, "", nil, false
			decisionPool.Put(w)
			return r.Reply, r.Err
		case <-ctx.Done():
			w.stall.Stop()
			// Not sent if still waiting; else its outcome is unknown. w
			// stays with its lane or its call and is not reused.
			if w.state.CompareAndSwap(queued, gone) || w.state.CompareAndSwap(taken, gone) {
				return nil, d.Classify(sc.Name(), ctx.Err())
			}
			// Chosen to lead its call: the call is sent first.
			r := <-w.done
			if r.Err == errLead {
				d.leadAny(w)
				r = <-w.done
			}
			return r.Reply, r.Err
		}
	}
}

// leadAny sends the call w was chosen to lead: a call of several keys,
// or the next call on its key.
func (d *Decisions) leadAny(w *decision) {
	if w.keys {
		d.leadKeys(w.batch)
		return
	}
	d.lead(w.key, w.batch)
}

// laneDepth is how many calls on one key are sent as they come before
// decisions wait: with two, Redis runs one while the reply of the other
// travels and its callers wake. Chosen with the harness's hot-key rows
// (bench/, G=16 and G=64): one did no better at either, more did worse at
// G=64, where the calls carry fewer decisions each.
const laneDepth = 2

// DirectCalls is how many calls in flight on a store it sends on their
// own, each on a pooled connection and its caller's goroutine, before it
// pipelines them (rueidis.LoneCalls, goredis.DirectCalls). A hot key has
// at most laneDepth calls in flight here, and sent directly rather than
// through a pipeline's writer and reader or a flusher goroutine they made
// more decisions a second at G=16 and G=64 than with one direct call
// (bench/, make bench: BENCHMARKS.md); 2 to 8 measured alike, while 16
// sent the 100k-key rows' calls at G=16 unpipelined, which cost them.
const DirectCalls = 4

// DefaultKeysDepth and DefaultKeysFrom are the Depth and KeysFrom both
// Redis stores use by default (goredis and rueidis StoreOptions): with 2
// calls in flight and 32 decisions in the store, decisions on other keys
// wait and go together; 16 callers' decisions go at once. In the
// harness's interleaved run kept as
// bench/runs/2026-12-08-xeon-cd7bc58-keysfrom.md (token bucket, 100k keys,
// 5 runs of 2 s; docs/DESIGN.md has its table), rueidis made 136.5k and
// 179.2k decisions a second at 64 and 256 callers with them, against
// 118.3k and 141.7k with no calls of several keys; at 16 callers, where
// waiting once 2 calls were in flight whatever the callers (KeysFrom 1)
// made 66.0k against none's 76.8k, they made 75.1k. go-redis: 135.9k and
// 178.0k against 103.3k and 136.7k, and 59.4k at 16 against 60.4k.
const (
	DefaultKeysDepth = 2
	DefaultKeysFrom  = 32
)

// DefaultStallAfter bounds head-of-line waiting (see Decisions), as the
// go-redis coalescer bounds it; maxStallCalls bounds the calls in flight
// on one key.
const (
	DefaultStallAfter = 2 * time.Millisecond
	maxStallCalls     = 64
)

// errLead, as a waiting decision's outcome, makes its caller send the
// call in its batch: the callers of a key's decisions send its calls in
// turn, and no goroutine is started for them.
var errLead = errors.New("holdfast: lead the next call")

// landed ends a call in flight on key: what waited on it goes in the next
// call, led by the first of its callers, or the key has one call fewer in
// flight.
func (d *Decisions) landed(key string) {
	d.mu.Lock()
	batch := d.takeLocked(key, nil)
	if len(batch) == 0 {
		d.inflight-- // else the key's next call takes its place
	}
	multi := d.dispatchLocked()
	d.mu.Unlock()
	if len(batch) > 0 {
		handLead(batch, func() { d.lead(key, batch) })
	}
	for _, b := range multi {
		handLead(b, func() { d.leadKeys(b) })
	}
}

// handLead makes the first caller of batch still waiting send it (errLead);
// when every caller in it gave up, send sends it on a goroutine of its
// own, as it was taken.
func handLead(batch []*decision, send func()) {
	for _, w := range batch {
		if w.state.CompareAndSwap(taken, leading) {
			w.batch = batch
			w.done <- driver.CallResult{Err: errLead}
			return
		}
	}
	go send()
}

// lead sends batch, a call on key, hands the next call on, and then gives
// each decision its outcome: the next call is on its way while the
// callers of this one wake.
func (d *Decisions) lead(key string, batch []*decision) {
	reply, err := d.call(batch)
	d.landed(key)
	d.deliver(batch, reply, err)
}

// kick sends what waits on key now, beside the calls in flight, for a
// decision that has waited StallAfter.
func (d *Decisions) kick(key string) {
	d.mu.Lock()
	ln := d.lanes[key]
	var batch []*decision
	if ln != nil && ln.inflight < maxStallCalls {
		batch = d.pickLocked(ln, nil)
		if len(batch) > 0 {
			ln.inflight++
			d.inflight++
		}
	}
	d.mu.Unlock()
	if len(batch) > 0 {
		go d.lead(key, batch)
	}
}

// takeLocked ends a call in flight on key and returns the next call's
// decisions, taken from the key's lane; with none waiting and no call in
// flight the key's lane is gone. d.mu is held.
func (d *Decisions) takeLocked(key string, batch []*decision) []*decision {
	ln := d.lanes[key]
	batch = d.pickLocked(ln, batch)
	if len(batch) > 0 {
		return batch
	}
	ln.inflight--
	if ln.inflight == 0 {
		delete(d.lanes, key)
		ln.waiting = ln.waiting[:0]
		lanePool.Put(ln)
	}
	return batch
}

// pickLocked appends to batch the first live decision waiting in ln and
// those after it that can share its call; the others keep waiting, in
// order. d.mu is held.
func (d *Decisions) pickLocked(ln *lane, batch []*decision) []*decision {
	batch, ln.waiting = pick(ln.waiting, batch)
	return batch
}

// pick appends to batch the first live decision of q and those after it
// that can share its call: the same script and shared arguments and hash
// slot (Decisions.Cluster), up to maxDecisions in batch. It returns batch
// and what stays in q, in order; decisions whose callers gave up leave q.
func pick(q, batch []*decision) (_, rest []*decision) {
	var first *decision
	left := 0
	for _, w := range q {
		switch {
		case w.state.Load() == gone:
			continue // its caller gave up: dropped
		case first != nil && (len(batch) == maxDecisions || w.sc != first.sc || w.slot != first.slot || !w.sc.Many().SameShared(w.args, first.args)):
			q[left] = w
			left++
			continue
		case !w.state.CompareAndSwap(queued, taken):
			continue
		}
		if first == nil {
			first = w
		}
		batch = append(batch, w)
	}
	clear(q[left:])
	return batch, q[:left]
}

// call makes batch's call and returns its reply. A call of one decision
// is sent as a Run call alone; a call of several is a call of their Many,
// whose deadline is the latest of theirs (none if one has none), so that
// a decision with a short deadline does not fail the others.
func (d *Decisions) call(batch []*decision) ([]int64, error) {
	first := batch[0]
	if len(batch) == 1 {
		return d.One(first.ctx, first.sc, []string{first.key}, first.args)
	}
	m := first.sc.Many()
	ctx, cancel := batchContext(batch)
	defer cancel()
	args := make([]string, 0, m.Shared+len(batch)*(m.Each+1))
	args = append(args, first.args[:m.Shared]...)
	for _, w := range batch {
		args = m.AppendDecision(args, w.args)
	}
	d.calls.Add(1)
	d.batched.Add(int64(len(batch)))
	return d.One(ctx, m.Script, []string{first.key}, args)
}

// batchContext returns the context of a call of batch's decisions: its
// deadline is the latest of theirs (none if one has none), so that a
// decision with a short deadline does not fail the others.
func batchContext(batch []*decision) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, w := range batch {
		t, ok := w.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if t.After(latest) {
			latest = t
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// dispatchLocked takes from d.queue the calls of several keys that the
// store has room for (Depth) and returns them. d.mu is held.
func (d *Decisions) dispatchLocked() (multi [][]*decision) {
	for len(d.queue) > 0 && d.inflight < d.Depth {
		b := d.pickQueueLocked()
		if len(b) == 0 {
			break
		}
		d.inflight++
		multi = append(multi, b)
	}
	return multi
}

// kickKeys sends what waits in d.queue now, beside the calls in flight,
// for a decision that has waited StallAfter there.
func (d *Decisions) kickKeys() {
	d.mu.Lock()
	var b []*decision
	if d.inflight < d.Depth+maxStallCalls {
		if b = d.pickQueueLocked(); len(b) > 0 {
			d.inflight++
		}
	}
	d.mu.Unlock()
	if len(b) > 0 {
		go d.leadKeys(b)
	}
}

// pickQueueLocked takes the first live decision of d.queue and those
// after it that can share its call (pick); the others keep waiting, in
// order. d.mu is held.
func (d *Decisions) pickQueueLocked() []*decision {
	var batch []*decision
	batch, d.queue = pick(d.queue, nil)
	return batch
}

// leadKeys sends batch, decisions taken from d.queue, in one call, lets
// the store's next calls go, and then gives each decision its outcome.
func (d *Decisions) leadKeys(batch []*decision) {
	reply, keyed, err := d.callKeys(batch)
	d.mu.Lock()
	d.inflight--
	multi := d.dispatchLocked()
	d.mu.Unlock()
	for _, b := range multi {
		handLead(b, func() { d.leadKeys(b) })
	}
	if !keyed {
		d.deliver(batch, reply, err)
		return
	}
	d.deliverKeys(batch, reply, err)
}

// callKeys makes the call of batch's decisions, on any keys: one decision
// alone, one key's in a call of its Many, and several keys' in a call of
// its Keys (keyed), for which it orders batch as the call holds them: by
// key, each key's decisions in the order they came.
func (d *Decisions) callKeys(batch []*decision) (reply []int64, keyed bool, err error) {
	first := batch[0]
	group := make(map[string]int, len(batch)) // key: its place among the call's keys
	var keys []string
	var counts []int
	for _, w := range batch {
		i, ok := group[w.key]
		if !ok {
			i = len(keys)
			group[w.key] = i
			keys = append(keys, w.key)
			counts = append(counts, 0)
		}
		counts[i]++
	}
	if len(keys) == 1 {
		reply, err = d.call(batch)
		return reply, false, err
	}
	// Order batch by key: each key's decisions start at its offset.
	at := make([]int, len(keys))
	for i := 1; i < len(keys); i++ {
		at[i] = at[i-1] + counts[i-1]
	}
	ordered := make([]*decision, len(batch))
	for _, w := range batch {
		i := group[w.key]
		ordered[at[i]] = w
		at[i]++
	}
	copy(batch, ordered)
	m := first.sc.Many()
	args := make([]string, 0, m.Shared+len(keys)+len(batch)*(m.Each+1))
	args = append(args, first.args[:m.Shared]...)
	o := 0
	for i := range keys {
		args = append(args, strconv.Itoa(counts[i]))
		for _, w := range batch[o : o+counts[i]] {
			args = m.AppendDecision(args, w.args)
		}
		o += counts[i]
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	d.keyCalls.Add(1)
	d.keyed.Add(int64(len(batch)))
	reply, err = d.One(ctx, m.Keys, keys, args)
	return reply, true, err
}

// deliverKeys gives each decision of batch, ordered as its Keys call
// held them, its outcome from the call's reply or error. The decisions
// whose key failed in the call (driver.ManyAlone) are sent again, each
// on its own, to learn their error.
func (d *Decisions) deliverKeys(batch []*decision, reply []int64, err error) {
	if err == nil && len(reply) != len(batch)*driver.ManyStride {
		err = driver.Errorf(core.ErrMalformedReply, "script %s: reply of %d integers is not that of %d decisions", batch[0].sc.Many().Keys.Name(), len(reply), len(batch))
	}
	for i, w := range batch {
		if err != nil {
			w.done <- driver.CallResult{Err: err}
			continue
		}
		r := reply[i*driver.ManyStride : (i+1)*driver.ManyStride : (i+1)*driver.ManyStride]
		switch r[0] {
		case 0:
			w.done <- driver.CallResult{Reply: r[1:]}
		case driver.ManyStale:
			w.done <- driver.CallResult{Err: stale(w.sc.Name())}
		case driver.ManyAlone:
			go func() {
				r, err := d.One(w.ctx, w.sc, []string{w.key}, w.args)
				w.done <- driver.CallResult{Reply: r, Err: err}
			}()
		default:
			w.done <- driver.CallResult{Err: driver.Errorf(core.ErrMalformedReply, "script %s: status %d of a decision", w.sc.Many().Keys.Name(), r[0])}
		}
	}
}

// deliver gives each decision of batch its outcome from the call's reply
// or error.
func (d *Decisions) deliver(batch []*decision, reply []int64, err error) {
	if len(batch) == 1 {
		batch[0].done <- driver.CallResult{Reply: reply, Err: err}
		return
	}
	var replies [][]int64
	if err == nil {
		var ok bool
		if replies, ok = driver.SplitMany(reply, len(batch)); !ok {
			err = driver.Errorf(core.ErrMalformedReply, "script %s: reply of %d integers is not that of %d decisions", batch[0].sc.Many().Script.Name(), len(reply), len(batch))
		}
	}
	for i, w := range batch {
		switch {
		case err != nil:
			w.done <- driver.CallResult{Err: err}
		case replies[i] == nil:
			w.done <- driver.CallResult{Err: stale(w.sc.Name())}
		default:
			w.done <- driver.CallResult{Reply: replies[i]}
		}
	}
}

// staleText is the deadline guard's error reply (driver.NewDecisionScript).
const staleText = "STALE holdfast: the call ran after its deadline"

// stale is the error of a decision a Many call refused at its deadline:
// the guard's STALE, as a store maps that reply.
func stale(name string) error {
	class, reason := ClassifyReply(staleText)
	return &core.StoreError{Class: class, Reason: reason, Answered: true, Err: driver.Errorf(core.ErrStoreUnavailable, "script %s: %s", name, staleText)}
}

package fallback

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	_ "github.com/holdfast/holdfast/algorithms" // a state dir names algorithms: register the built-in ones
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// probe is the breaker's health check: the membership heartbeat, a write
// through a script under the same ACL, prefix and shard as the decisions.
// A PING would answer while Redis refuses every write (OOM, READONLY,
// NOPERM, MISCONF) and close the breaker on a Redis that cannot take a
// single decision.
func (l *cell) probe(ctx context.Context) error {
	_, err := l.heartbeat(ctx)
	if err != nil {
		l.noteFault(err)
	}
	return err
}

// heartbeat refreshes this instance's membership and learns the live
// instance count (never less than 1), the store's clock and its data
// epoch; lost reports an epoch other than the one read before (Redis lost
// its data: a restore is due).
func (l *cell) heartbeat(ctx context.Context) (lost bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
	defer cancel()
	ttl := strconv.FormatInt(3*l.o.Heartbeat.Microseconds(), 10)
	raw, err := l.store.Run(ctx, membersScript, []string{l.members}, []string{l.o.ID, ttl})
	if err != nil {
		return false, err
	}
	if len(raw) != 2 || raw[1] <= 0 {
		return false, driver.Errorf(core.ErrMalformedReply, "membership reply %v", raw)
	}
	l.setInstances(max(raw[0], 1))
	if l.breaker.State() == Closed {
		// A count learned while deciding through Redis: the fleet's, not
		// that of the instances back first from an outage.
		l.countKnown.Store(true)
	}
	l.setOffset(raw[1])
	return l.readEpoch(ctx)
}

// epochEvery is how often the data epoch is read between heartbeats while
// the breaker is closed (or every heartbeat, when that is shorter): a
// Redis that lost its data while answering is found within it, so the
// decisions that start from its empty keys meanwhile are few.
const epochEvery = 100 * time.Millisecond

// readEpoch reads the data epoch and generation; lost reports an epoch
// other than read before, or a generation gone back (see noteEpoch). ctx
// carries the call's deadline.
func (l *cell) readEpoch(ctx context.Context) (lost bool, err error) {
	if l.epochKey == nil {
		return false, nil // a store in this process
	}
	sent := l.gen.Load()
	epoch, now, gen, renewed, err := l.runEpoch(ctx, 0)
	if err != nil {
		return false, err
	}
	return l.noteEpoch(epoch, now, gen, renewed, sent), nil
}

// runEpoch runs the epoch script (epoch.lua), renewing epoch renew if it
// is not 0 and still the epoch, and returns its reply.
func (l *cell) runEpoch(ctx context.Context, renew int64) (epoch, now, gen int64, renewed bool, err error) {
	var args []string
	if renew != 0 {
		args = []string{strconv.FormatInt(renew, 10)}
	}
	raw, err := l.store.Run(ctx, epochScript, l.epochKey, args)
	if err != nil {
		return 0, 0, 0, false, err
	}
	if len(raw) != 4 || raw[0] <= 0 || raw[1] <= 0 || raw[2] <= 0 || raw[3] < 0 || raw[3] > 1 {
		return 0, 0, 0, false, driver.Errorf(core.ErrMalformedReply, "epoch reply %v", raw)
	}
	return raw[0], raw[1], raw[2], raw[3] == 1, nil
}

// checkEpoch reads the data epoch between heartbeats, while the breaker is
// closed: a loss opens it, as a failed read counts against it.
func (l *cell) checkEpoch(ctx context.Context) {
	gen, ok := l.breaker.Allow()
	if !ok || l.retired.Load() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
	defer cancel()
	start := l.o.Clock()
	lost, err := l.readEpoch(cctx)
	l.settle(ctx, gen, start, lost, err)
}

// settle tells the breaker how a background call made in generation gen
// from start went (a heartbeat, an epoch read), and reports whether Redis
// is usable: lost (Redis lost its data) opens the breaker, since decisions
// through Redis would start from its empty keys and the recovery restores
// the known states first; a failure counts as a failed decision does.
func (l *cell) settle(ctx context.Context, gen uint64, start time.Time, lost bool, err error) bool {
	switch {
	case lost:
		l.breaker.Refused(gen, dataLost)
		return false
	case err == nil:
		l.breaker.Done(gen, nil, l.o.Clock().Sub(start))
		return true
	case core.ClassOf(err) != core.ClassRequest && ctx.Err() == nil:
		l.storeFailed(gen, err, l.o.Clock().Sub(start))
	}
	return false
}

// setInstances takes a new live instance count. An increase is taken at
// once (a smaller share is always safe). A decrease is taken only once this
// instance has been deciding through Redis for a whole heartbeat lifetime
// (after an outage or at start the other instances' heartbeats have lapsed
// and are still coming back) and the lower count has held for ShrinkAfter:
// an instance cut off from Redis while this one is not stops heartbeating
// but keeps granting its share from leases, and if this one then lost Redis
// too, a share computed from the lower count would add to theirs.
func (l *cell) setInstances(n int64) {
	l.countMu.Lock()
	defer l.countMu.Unlock()
	cur := l.instances.Load()
	now := l.o.Clock().UnixNano()
	if n >= cur {
		l.lowSince, l.lowMax = 0, 0
		l.instances.Store(n)
		return
	}
	if l.lowSince == 0 {
		l.lowSince = now
	}
	l.lowMax = max(l.lowMax, n)
	settled := l.breaker.State() == Closed && now-l.closedSince.Load() >= int64(3*l.o.Heartbeat)
	if settled && now-l.lowSince >= int64(l.o.ShrinkAfter) {
		l.instances.Store(l.lowMax)
		l.lowSince, l.lowMax = 0, 0
	}
}

// background heartbeats while the breaker is closed and flushes grants
// logged after the last replay (requests decided locally while the breaker
// was closing, or a log read back from the state dir).
func (l *cell) background(ctx context.Context) {
	tick := l.o.After(l.o.Heartbeat)
	var epochTick <-chan time.Time
	if every := min(epochEvery, l.o.Heartbeat); every < l.o.Heartbeat {
		epochTick = l.o.After(every)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-epochTick:
			epochTick = l.o.After(epochEvery)
			l.checkEpoch(ctx)
			continue
		case <-l.flushNow:
			if gen, ok := l.breaker.Allow(); ok && l.pendingWork() {
				l.flush(ctx, gen)
			}
			continue
		case <-tick:
			tick = l.o.After(l.o.Heartbeat)
		}
		if l.retired.Load() && !l.pendingWork() {
			// The shards' cells decide every key now; this whole-store
			// breaker only had a log to flush, and it is empty. (With
			// slots no shard served, it still decides their keys, and
			// keeps its heartbeat.)
			continue
		}
		gen, ok := l.breaker.Allow()
		if !ok {
			continue
		}
		start := l.o.Clock()
		lost, err := l.heartbeat(ctx)
		if l.settle(ctx, gen, start, lost, err) && l.pendingWork() {
			l.flush(ctx, gen)
		}
	}
}

// pendingWork reports whether grants, resets or refunds wait to be applied
// in Redis.
func (l *cell) pendingWork() bool {
	return l.log.pending() > 0 || l.resets.len() > 0 || l.refunds.len() > 0
}

// flush replays grants logged after the last replay, while the breaker is
// closed (generation gen). A failure keeps them in the log and counts
// against the breaker, as a failed decision call does: a Redis that
// refuses the replay (OOM, READONLY) cannot take decisions either.
func (l *cell) flush(ctx context.Context, gen uint64) {
	start := l.o.Clock()
	err := l.reconcile(ctx)
	if err == nil || ctx.Err() != nil {
		return
	}
	l.o.Logger.Warn("holdfast flush", "instance", l.o.ID, "err", err)
	if core.ClassOf(err) != core.ClassRequest {
		l.storeFailed(gen, err, l.o.Clock().Sub(start))
	}
}

//go:embed recovery.lua
var recoverySource string

var recoveryScript = driver.NewScript("recovery", recoverySource, nil)

// recover is the breaker's Reconcile: replay the log, then wait at the
// recovery barrier until every instance of this outage has found Redis back
// and replayed its own log, or has had time to; then the breaker closes and
// what was granted meanwhile is flushed at once (see flushNow). Instances
// thus return to Redis together, and a decision through Redis misses at most
// the grants another instance made in the last moments before the barrier,
// for as long as one flush takes.
//
// The barrier's time is set two probe intervals and two call deadlines
// ahead by the first instance to arrive (recovery.lua); it comes forward
// to the moment the last of the instances the arrivals counted before the
// outage arrives, each after its replay, which the waiting instances learn
// by reading it every barrierPoll. An instance that counted no one (it
// started during the outage) or one that does not come back keeps it at
// its time.
func (l *cell) recover(ctx context.Context) error {
	if err := l.reconcile(ctx); err != nil {
		return err
	}
	_, _ = l.heartbeat(ctx) // be counted before anyone returns to Redis (a data loss found here is restored just below)
	l.confirming.Store(true)
	// Grants logged between the replay above and the switch are replayed now.
	if err := l.reconcile(ctx); err != nil {
		return err
	}
	ahead := 2*l.breaker.ProbeInterval() + 2*l.breaker.CallTimeout()
	wait, err := l.atBarrier(ctx, ahead, true)
	if err != nil {
		return err
	}
	if wait <= 0 {
		return nil
	}
	end := l.o.Clock().Add(min(wait, 2*ahead))
	polling := true
	for {
		left := end.Sub(l.o.Clock())
		if left <= 0 {
			return nil
		}
		if polling {
			left = min(left, barrierPoll)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.o.After(left):
		}
		if !polling {
			return nil
		}
		switch wait, err := l.atBarrier(ctx, ahead, false); {
		case err != nil:
			// The time already read stands, waited out at once: a Redis
			// gone again fails the first decisions after it and opens
			// the breaker.
			polling = false
		case wait <= 0:
			return nil
		}
	}
}

// barrierPoll is how often an instance waiting at the recovery barrier
// reads whether the barrier came forward: every instance it waits for has
// arrived.
const barrierPoll = 25 * time.Millisecond

// atBarrier runs the recovery barrier's script (recovery.lua), as this
// instance's arrival (arrive) or a read, and returns how long to wait.
func (l *cell) atBarrier(ctx context.Context, ahead time.Duration, arrive bool) (time.Duration, error) {
	args := []string{strconv.FormatInt(ahead.Microseconds(), 10), "", "0"}
	if arrive {
		args[1] = l.o.ID
		if l.countKnown.Load() {
			args[2] = strconv.FormatInt(l.instances.Load(), 10)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
	raw, err := l.store.Run(cctx, recoveryScript, []string{l.barrier, l.barrier + ":in"}, args)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("fallback: recovery barrier: %w", err)
	}
	if len(raw) != 2 {
		return 0, driver.Errorf(core.ErrMalformedReply, "recovery barrier reply %v", raw)
	}
	return time.Duration(raw[0]-raw[1]) * time.Microsecond, nil
}

// reconcile replays the outage log until it is empty: grants keep arriving
// while the breaker is reconciling, since requests still decide locally.
func (l *cell) reconcile(ctx context.Context) error {
	l.reconMu.Lock()
	defer l.reconMu.Unlock()
	start := l.o.Clock()
	if err := l.restoreKnown(ctx); err != nil {
		return err
	}
	if err := l.applyResets(ctx); err != nil {
		return fmt.Errorf("fallback: reset: %w", err)
	}
	if err := l.applyRefunds(ctx); err != nil {
		return fmt.Errorf("fallback: refund: %w", err)
	}
	total := 0
	for round := 0; round < 20; round++ {
		batches := l.log.seal()
		if len(batches) == 0 {
			break
		}
		// The seals are on disk before Redis sees their batches (a
		// restart replays them under the same ids: counted once).
		l.jnl.syncNow()
		errs := l.rec.Reconcile(ctx, l.store, batches)
		l.log.ack(batches, errs)
		l.noteReplayed(batches, errs)
		for _, b := range batches {
			total += len(b.Grants)
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("fallback: reconcile: %w", err)
		}
	}
	took := l.o.Clock().Sub(start)
	l.lastRecon.Store(int64(took))
	l.reconciles.Add(1)
	l.o.Logger.Info("holdfast reconciled", "instance", l.o.ID, "grants", total, "took", took.String(), "pending", l.log.pending())
	return nil
}

// Status is a snapshot of the Limiter for operators.
type Status struct {
	ID string `json:"id"`
	// Breaker is the breaker's state; on Redis Cluster, the worst of the
	// shards' (open, then reconciling, then closed).
	Breaker string `json:"breaker"`
	// Instances is the live instance count (on Cluster, the largest of the
	// shards' counts).
	Instances int64 `json:"instances"`
	// PendingLog is the number of outage log entries not yet replayed: one
	// per grant, but a token bucket key's grants within a millisecond are
	// one entry.
	PendingLog int `json:"pending_log"`
	// PendingRefunds is the number of AllowAll refunds (of a request Redis
	// admitted, given back when another request denied) that the breaker
	// kept from Redis: applied when it returns.
	PendingRefunds int `json:"pending_refunds"`
	// LostRefunds counts the refunds that failed in Redis (never sent
	// again: one may have been applied) or were dropped past the pending
	// bound: each leaves its charge spent, an under-admission.
	LostRefunds uint64 `json:"lost_refunds"`
	Reconciles  uint64 `json:"reconciles"`
	// RestoredKeys counts the known states written back after Redis lost
	// its data (Options.RestoreKeys), over the Limiter's life.
	RestoredKeys uint64        `json:"restored_keys"`
	LastRecon    time.Duration `json:"last_reconcile_ns"`
	// LastError is the last failed store call (a decision, a probe, a
	// heartbeat or a replay): nil if none has failed.
	LastError *ErrorStatus `json:"last_error,omitempty"`
	// Shards holds each Cluster shard's own state; empty on a single node.
	Shards []ShardStatus `json:"shards,omitempty"`
}

// ErrorStatus is a failed store call as Status shows it: its class
// ("unavailable", "unknown"), its reason (a Redis error code such as "OOM"
// or "NOPERM", or "network", "deadline", "malformed", "unknown"; never the
// message text) and when it happened.
type ErrorStatus struct {
	Class  string    `json:"class"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// ShardStatus is one Redis Cluster shard's breaker, instance count and log.
type ShardStatus struct {
	Slots      string `json:"slots"`
	Breaker    string `json:"breaker"`
	Instances  int64  `json:"instances"`
	PendingLog int    `json:"pending_log"`
}

// Status returns the Limiter's state.
func (l *Limiter) Status() Status {
	st := l.cell.status()
	if set := l.shards.Load(); set != nil {
		set.status(&st)
	}
	return st
}

// status is the cell's own state.
func (l *cell) status() Status {
	st := Status{
		ID:             l.o.ID,
		Breaker:        l.breaker.State().String(),
		Instances:      l.instances.Load(),
		PendingLog:     l.log.pending(),
		PendingRefunds: l.refunds.len(),
		LostRefunds:    l.refunds.lost.Load(),
		Reconciles:     l.reconciles.Load(),
		RestoredKeys:   l.restored.Load(),
		LastRecon:      time.Duration(l.lastRecon.Load()),
	}
	if f := l.lastErr.Load(); f != nil {
		st.LastError = &ErrorStatus{Class: f.class.String(), Reason: f.reason, At: f.at}
	}
	return st
}

// Breaker returns the Limiter's circuit breaker: on Redis Cluster, the one
// for the whole store, used only until the topology is known (Status.Shards
// has each shard's state).
func (l *Limiter) Breaker() *Breaker { return l.breaker }

// algorithmByName is the algorithm registered as name (driver.Register).
func algorithmByName(name string) (driver.Algorithm, error) { return driver.AlgorithmByName(name) }

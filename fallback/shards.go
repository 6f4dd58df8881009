package fallback

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/holdfast/holdfast/core/driver"
)

// shardSet routes each storage key to the cell of its Redis Cluster shard.
// A cell is a Limiter of its own (breaker, leases, outage log, membership,
// recovery barrier) over the same store, whose membership and barrier keys
// hash into its shard; so each shard fails, degrades and recovers alone.
//
// The slot map is the one read at Start. A failover keeps a shard's slots
// together (the replica takes them all), so the map stays right; slots moved
// by resharding while the Limiter runs are still decided correctly (the
// client follows the redirect) but under their old shard's breaker.
type shardSet struct {
	cells  []*cell
	slots  []string // each cell's slot ranges, for Status
	bySlot [driver.SlotCount]int16
	// covered: every slot had a shard; else the whole-store limiter still
	// decides the others' keys (cellFor returns nil).
	covered bool
}

// cellFor returns the cell of the slot of StorageKey(prefix, policy, key),
// or nil for a slot no shard served when the topology was read (the
// whole-store breaker decides those).
func (s *shardSet) cellFor(prefix, policy, key string) *cell {
	if i := s.bySlot[driver.StorageSlot(prefix, policy, key)]; i >= 0 {
		return s.cells[i]
	}
	return nil
}

// worst is the most degraded state among the cells.
func (s *shardSet) worst() State {
	w := Closed
	for _, c := range s.cells {
		switch st := c.breaker.State(); {
		case st == Open:
			return Open
		case st == Reconciling:
			w = Reconciling
		}
	}
	return w
}

// status folds the cells' states into st.
func (s *shardSet) status(st *Status) {
	st.Breaker = s.worst().String()
	for i, c := range s.cells {
		cs := c.status()
		st.Instances = max(st.Instances, cs.Instances)
		st.PendingLog += cs.PendingLog
		st.PendingRefunds += cs.PendingRefunds
		st.LostRefunds += cs.LostRefunds
		st.Reconciles += cs.Reconciles
		st.RestoredKeys += cs.RestoredKeys
		st.LastRecon = max(st.LastRecon, cs.LastRecon)
		if e := cs.LastError; e != nil && (st.LastError == nil || e.At.After(st.LastError.At)) {
			st.LastError = e
		}
		st.Shards = append(st.Shards, ShardStatus{Slots: s.slots[i], Breaker: cs.Breaker, Instances: cs.Instances, PendingLog: cs.PendingLog})
	}
}

// startShards reads the cluster topology and starts a cell per shard. When
// Redis cannot be reached now it tries again every heartbeat, and until then
// the whole-store breaker decides every key.
func (l *Limiter) startShards(ctx context.Context, sh driver.Sharded) {
	if l.tryShards(ctx, sh) {
		return
	}
	l.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-l.o.After(l.o.Heartbeat):
				if l.tryShards(ctx, sh) {
					return
				}
			}
		}
	})
}

// tryShards reads the topology and installs the cells; it reports whether
// it is done (installed, or the store is not a cluster).
func (l *Limiter) tryShards(ctx context.Context, sh driver.Sharded) bool {
	cctx, cancel := context.WithTimeout(ctx, 4*l.breaker.CallTimeout())
	shards, err := sh.Shards(cctx)
	cancel()
	if err != nil {
		l.o.Logger.Warn("holdfast cluster topology", "instance", l.o.ID, "err", err)
		return false
	}
	if len(shards) < 2 {
		return true // one breaker is the right scope
	}
	set, err := l.newShardSet(ctx, shards)
	if err != nil {
		l.o.Logger.Warn("holdfast cluster topology", "instance", l.o.ID, "err", err)
		return false
	}
	l.shards.Store(set)
	// The shards' cells decide every key now; the whole store's cell only
	// has a log to flush. (With slots no shard served, it still decides
	// their keys, and keeps its heartbeat.)
	l.cell.retired.Store(set.covered)
	l.cellChanged(Closed, Closed) // report the cells' state in place of the whole store's
	l.o.Logger.Info("holdfast cluster", "instance", l.o.ID, "shards", len(set.cells), "slots", strings.Join(set.slots, " | "))
	return true
}

// newShardSet builds and starts one cell per shard.
func (l *Limiter) newShardSet(ctx context.Context, shards []driver.Shard) (*shardSet, error) {
	set := &shardSet{}
	for i := range set.bySlot {
		set.bySlot[i] = -1
	}
	for i, sh := range shards {
		for _, r := range sh.Slots {
			for s := r.Start; s <= r.End; s++ {
				set.bySlot[s] = int16(i)
			}
		}
	}
	set.covered = !slices.Contains(set.bySlot[:], -1)
	for i, sh := range shards {
		tag, err := shardTag(sh.Slots, &set.bySlot, i)
		if err != nil {
			return nil, err
		}
		c, err := newCell(l.store, l.o, tag, l.cellChanged)
		if err == nil {
			err = c.start(ctx)
		}
		if err != nil {
			if c != nil {
				_ = c.close()
			}
			for _, c := range set.cells {
				_ = c.close()
			}
			return nil, fmt.Errorf("fallback: shard %s: %w", tag, err)
		}
		set.cells = append(set.cells, c)
		set.slots = append(set.slots, formatSlots(sh.Slots))
	}
	return set, nil
}

// shardTag is the hash tag of cell i's membership and barrier keys: the
// first "shard-N" whose slot is the shard's. Every instance computes the
// same tag from the same topology, so they meet on the same keys.
func shardTag(slots []driver.SlotRange, bySlot *[driver.SlotCount]int16, i int) (string, error) {
	if len(slots) == 0 {
		return "", fmt.Errorf("fallback: shard %d has no slots", i)
	}
	for n := 0; n < 1<<20; n++ {
		tag := "shard-" + strconv.Itoa(n)
		if bySlot[driver.HashSlot(tag)] == int16(i) {
			return tag, nil
		}
	}
	return "", fmt.Errorf("fallback: no hash tag found for shard %d", i)
}

func formatSlots(rs []driver.SlotRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(r.Start) + "-" + strconv.Itoa(r.End)
	}
	return strings.Join(parts, ",")
}

// wholeChanged is the whole store's cell's transition: the caller's
// OnStateChange sees it until shard cells decide.
func (l *Limiter) wholeChanged(_, to State) {
	if l.shards.Load() == nil {
		l.notify(to)
	}
}

// cellChanged is each shard cell's transition: the caller's OnStateChange
// sees the worst state among the shards.
func (l *Limiter) cellChanged(_, _ State) {
	if set := l.shards.Load(); set != nil {
		l.notify(set.worst())
	}
}

// notify reports state to the caller's OnStateChange if it differs from the
// last one reported.
func (l *Limiter) notify(state State) {
	l.notifyMu.Lock()
	defer l.notifyMu.Unlock()
	if state == l.notified {
		return
	}
	from := l.notified
	l.notified = state
	if l.user != nil {
		l.user(from, state)
	}
}

package fallback

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// ErrLogFull reports that the outage log holds its maximum of grants even
// after compaction: the request is denied rather than admitted unrecorded.
var ErrLogFull = errors.New("fallback: outage log full")

// outageLog holds the grants made without Redis until Redis acknowledges
// them. Grants of one key accumulate in an open batch; seal turns open
// batches into numbered batches, which are retried with the same ID until
// acknowledged, so a batch counts once however often it is sent.
//
// Memory is bounded by max grants. At the bound the log first compacts:
// each token bucket key's grants merge into one grant of their summed cost
// at the latest time (charging later refills less, so the merged grant
// never under-counts), and sliding window grants already outside their
// window are dropped (a replay would skip them). If that frees nothing the
// new grant is refused with ErrLogFull and the request denied: nothing
// granted is ever left out of the log.
type outageLog struct {
	mu     sync.Mutex
	prefix string // instance and process: batch IDs are unique across restarts
	// keyPrefix starts every storage key (Options.Prefix): addParts builds
	// keys from it.
	keyPrefix string
	seq       uint64
	open      map[string]*openBatch
	sealed    []*driver.Batch
	grants    int
	max       int
	// lastCompact is the store time of the last compaction that freed
	// nothing: at the bound, compaction is tried again only a second later,
	// so a flood of new keys costs one pass a second, not one per request.
	lastCompact int64
	buf         []byte // addParts builds keys here
	// last is the open batch addParts logged to last, and the parts of
	// its key: a hot key's next grant finds its batch without building
	// and hashing the key.
	last                *openBatch
	lastPolicy, lastKey string
	// journal, with a state dir, records each batch sealed and
	// acknowledged.
	journal *journal
}

// newOutageLog returns an empty log whose batch IDs start with prefix, for
// storage keys starting with keyPrefix, bounded at max grants.
func newOutageLog(prefix, keyPrefix string, max int) *outageLog {
	return &outageLog{prefix: prefix, keyPrefix: keyPrefix, open: make(map[string]*openBatch), max: max}
}

// openBatch is a key's batch still taking grants. A token bucket batch's
// last grant is live (see liveGrant): a grant within coalesceMicros of the
// first one merged into it is added to its cost instead of being appended,
// so a hot key's log grows by one grant a millisecond, not one per request.
type openBatch struct {
	driver.Batch
	// live is the last grant of a token bucket batch that has grants
	// (isLive); its Grants entry is stale until closeLive. One per batch,
	// reopened for each group.
	live   liveGrant
	isLive bool
	// coalesce is the policy's algorithm's rule (coalesces): its grants
	// join a live grant.
	coalesce bool
}

// liveGrant is an open batch's last token bucket grant while grants still
// coalesce into it without the log's lock: a decision adds its cost while
// it holds its key's lease lock (one writer per key at a time), and the log
// closes it under its own lock (seal, compaction, the key's next group) by
// swapping in a negative cost, after which an add fails and the grant goes
// the locked way. The close reads every cost added before it. at is raised
// before the cost is added, so a close may keep a later time than its
// costs need: charged later, never under-counted.
type liveGrant struct {
	cost  atomic.Int64 // negative: closed
	at    atomic.Int64
	start atomic.Int64 // the group's first grant time
}

// add adds a grant of cost at time at, if it falls in the group and the
// grant is not closed. An add that read the previous group's start and
// lands in the next group is charged at that group's later time: never
// under-counted.
func (lg *liveGrant) add(cost, at int64) bool {
	if at-lg.start.Load() >= coalesceMicros {
		return false
	}
	lg.raise(at)
	for {
		c := lg.cost.Load()
		if c < 0 {
			return false
		}
		if lg.cost.CompareAndSwap(c, c+cost) {
			return true
		}
	}
}

// raise makes at the grant's time if it is later.
func (lg *liveGrant) raise(at int64) {
	for a := lg.at.Load(); at > a && !lg.at.CompareAndSwap(a, at); a = lg.at.Load() {
	}
}

// closeLive writes b's live grant back into its last grant and closes it.
// The log's lock is held.
func (b *openBatch) closeLive() {
	if !b.isLive {
		return
	}
	last := &b.Grants[len(b.Grants)-1]
	last.Cost = b.live.cost.Swap(-1)
	last.At = b.live.at.Load()
	b.isLive = false
}

// openLive makes gr, just appended, b's live grant, and returns it.
func (b *openBatch) openLive(gr driver.Grant) *liveGrant {
	b.live.start.Store(gr.At)
	b.live.at.Store(gr.At)
	b.live.cost.Store(gr.Cost) // last: an add sees the group only now
	b.isLive = true
	return &b.live
}

// add logs a grant of key under policy p; seed is the key's known state
// when its lease began.
func (g *outageLog) add(key string, p core.Policy, seed driver.Seed, gr driver.Grant) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, err := g.addLocked(key, p, seed, gr)
	return err
}

// addParts is add for the key StorageKey(g.keyPrefix, p.Name(), key),
// built only when the key's batch is not the one last logged to. For a token bucket it returns the
// batch's live grant, which the key's next grants may join without the
// log's lock (liveGrant.add).
func (g *outageLog) addParts(key string, p core.Policy, seed driver.Seed, gr driver.Grant) (*liveGrant, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.last
	if b == nil || key != g.lastKey || p.Name() != g.lastPolicy {
		g.buf = driver.AppendStorageKey(g.buf[:0], g.keyPrefix, p.Name(), key)
		if b = g.open[string(g.buf)]; b == nil {
			var err error
			if b, err = g.openLocked(string(g.buf), p, seed, gr.At); err != nil {
				return nil, err
			}
		}
		// The client key as the tail of b's key ("…:key}"): the caller's
		// string is not kept.
		g.last, g.lastPolicy, g.lastKey = b, p.Name(), b.Key[len(b.Key)-1-len(key):len(b.Key)-1]
	}
	return g.appendLocked(b, gr)
}

func (g *outageLog) addLocked(key string, p core.Policy, seed driver.Seed, gr driver.Grant) (*liveGrant, error) {
	b := g.open[key]
	if b == nil {
		var err error
		if b, err = g.openLocked(key, p, seed, gr.At); err != nil {
			return nil, err
		}
	}
	return g.appendLocked(b, gr)
}

// openLocked starts key's open batch, if the log has room at store time
// now.
func (g *outageLog) openLocked(key string, p core.Policy, seed driver.Seed, now int64) (*openBatch, error) {
	if err := g.roomLocked(now); err != nil {
		return nil, err
	}
	b := &openBatch{Batch: driver.Batch{Key: key, Policy: p, Seed: seed}, coalesce: coalesces(p)}
	b.live.cost.Store(-1)
	g.open[key] = b
	return b, nil
}

// appendLocked adds gr to b: to its live grant when they coalesce (see
// openBatch), else as a new grant if the log has room. A coalescing
// batch's new grant is live, returned.
func (g *outageLog) appendLocked(b *openBatch, gr driver.Grant) (*liveGrant, error) {
	if b.coalesce && b.isLive && b.live.add(gr.Cost, gr.At) {
		return &b.live, nil
	}
	if err := g.roomLocked(gr.At); err != nil {
		return nil, err
	}
	b.closeLive()
	b.Grants = append(b.Grants, gr)
	g.grants++
	if !b.coalesce {
		return nil, nil
	}
	return b.openLive(gr), nil
}

// roomLocked makes room for one more grant at store time now, compacting
// at the bound, or reports ErrLogFull.
func (g *outageLog) roomLocked(now int64) error {
	if g.grants < g.max {
		return nil
	}
	if now-g.lastCompact < 1_000_000 {
		return ErrLogFull
	}
	g.compactLocked(now)
	if g.grants >= g.max {
		g.lastCompact = now
		return ErrLogFull
	}
	return nil
}

// compactLocked shrinks the open batches; see outageLog.
func (g *outageLog) compactLocked(now int64) {
	for _, b := range g.open {
		n := len(b.Grants)
		if n == 0 {
			continue
		}
		if b.isLive {
			// A token bucket: the earlier grants join the live one, which
			// stays open.
			if n > 1 {
				var cost int64
				for _, x := range b.Grants[:n-1] {
					cost += x.Cost
					b.live.raise(x.At)
				}
				b.live.cost.Add(cost)
				b.Grants = append(b.Grants[:0], b.Grants[n-1])
			}
		} else if !b.coalesce {
			b.Grants = slices.DeleteFunc(b.Grants, func(x driver.Grant) bool { return outdated(b.Policy, x.At, now) })
		}
		g.grants -= n - len(b.Grants)
	}
}

// maxBatchGrants bounds the grants of one batch: one replay script must stay
// short, since Redis runs nothing else meanwhile.
const maxBatchGrants = 1000

// coalesceMicros is the span within which a token bucket key's grants are
// charged as one, at the latest of their times, before replay: a hot key
// admitting a million requests a second replays a thousand grants a second.
// Charging later refills less, so coalescing never under-counts; it costs
// at most one span of refill per group.
const coalesceMicros = 1000

// seal numbers the open batches and returns every batch not yet
// acknowledged, oldest first. A key with more than maxBatchGrants grants
// is split into several batches.
func (g *outageLog) seal() []driver.Batch {
	g.mu.Lock()
	defer g.mu.Unlock()
	keys := make([]string, 0, len(g.open))
	for k, b := range g.open {
		if len(b.Grants) > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		b := g.open[k]
		b.closeLive()
		delete(g.open, k)
		g.last = nil
		slices.SortStableFunc(b.Grants, func(x, y driver.Grant) int { return cmp.Compare(x.At, y.At) })
		for len(b.Grants) > 0 {
			part := b.Batch
			part.Grants = b.Grants[:min(len(b.Grants), maxBatchGrants)]
			b.Grants = b.Grants[len(part.Grants):]
			g.seq++
			part.ID = g.prefix + ":" + strconv.FormatUint(g.seq, 10)
			g.sealed = append(g.sealed, &part)
			if g.journal != nil {
				g.journal.sealed(&part) // under the lock: in order with the key's grants
			}
		}
	}
	out := make([]driver.Batch, len(g.sealed))
	for i, b := range g.sealed {
		out[i] = *b
	}
	return out
}

// ack clears the batches whose error is nil.
func (g *outageLog) ack(batches []driver.Batch, errs []error) {
	done := make(map[string]bool, len(batches))
	for i, b := range batches {
		if errs[i] == nil {
			done[b.ID] = true
		}
	}
	if g.journal != nil {
		g.journal.acked(batches, errs)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sealed = slices.DeleteFunc(g.sealed, func(b *driver.Batch) bool {
		if done[b.ID] {
			g.grants -= len(b.Grants)
			return true
		}
		return false
	})
}

// nextID returns a new batch ID.
func (g *outageLog) nextID() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	return g.prefix + ":" + strconv.FormatUint(g.seq, 10)
}

// pending is the number of grants not yet acknowledged.
func (g *outageLog) pending() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.grants
}

// restore adds a sealed batch read back from the state dir.
func (g *outageLog) restore(b *driver.Batch) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sealed = append(g.sealed, b)
	g.grants += len(b.Grants)
}

// drop removes every grant of storage key skey not yet replayed: a Reset
// forgives them. With a state dir they are recorded as sealed and
// acknowledged, so a restart does not bring them back.
func (g *outageLog) drop(skey string) {
	g.mu.Lock()
	var gone []driver.Batch
	if b := g.open[skey]; b != nil {
		b.closeLive()
		delete(g.open, skey)
		g.last = nil
		g.grants -= len(b.Grants)
		for len(b.Grants) > 0 {
			part := b.Batch
			part.Grants = b.Grants[:min(len(b.Grants), maxBatchGrants)]
			b.Grants = b.Grants[len(part.Grants):]
			g.seq++
			part.ID = g.prefix + ":" + strconv.FormatUint(g.seq, 10)
			if g.journal != nil {
				g.journal.sealed(&part)
			}
			gone = append(gone, part)
		}
	}
	g.sealed = slices.DeleteFunc(g.sealed, func(b *driver.Batch) bool {
		if b.Key != skey {
			return false
		}
		g.grants -= len(b.Grants)
		gone = append(gone, *b)
		return true
	})
	g.mu.Unlock()
	if g.journal != nil && len(gone) > 0 {
		g.journal.acked(gone, make([]error, len(gone)))
	}
}

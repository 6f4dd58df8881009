package goredis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// Defaults of StoreOptions.
const (
	// DefaultPipelines is the most pipelines of coalesced Run calls in
	// flight at once.
	DefaultPipelines = 4
	// DefaultMaxBatch is the most Run calls coalesced into one pipeline.
	DefaultMaxBatch = 128
)

// StoreOptions tunes how a Store coalesces concurrent Run calls, as rueidis
// pipelines them on its own. A Run call that arrives while at most
// DirectCalls are in flight on the Store (itself included) is sent at once,
// on its own: a lone caller, and the few calls in flight on a hot key whose
// decisions share calls, wait for nothing but their round trip. A call that
// arrives while more are in flight is queued, and a few flusher goroutines
// send what is queued in pipelines:
// many calls share one round trip and one write and read on one connection,
// where each would otherwise pay its own, so concurrent callers make more
// decisions per second. Flushers start when calls are queued and exit when
// the queue is empty: an idle Store runs no goroutine, and a Store needs no
// Close.
//
// The zero value of each field means its documented default. As New and
// NewWithOptions return no error, a negative Pipelines or MaxBatch also
// means its default.
type StoreOptions struct {
	// NoCoalesce sends every Run call on its own, on a pooled connection.
	NoCoalesce bool
	// NoCollapse sends every decision in a call of its own: without it,
	// the decisions on one key that arrive while a call on that key is in
	// flight go together in one call (driver.Many, pipeline.Decisions).
	NoCollapse bool
	// KeysDepth is how many decision calls may be in flight on the Store
	// before decisions on keys without a call in flight wait for one to
	// land and go together in one call of several keys (driver.Many's
	// Keys; pipeline.Decisions.Depth), once KeysFrom decisions are in the
	// Store. 0 means DefaultKeysDepth; a negative KeysDepth sends no call
	// of several keys.
	KeysDepth int
	// KeysFrom is how many decisions must be in the Store at once, in
	// flight or waiting, before any waits to share a call of several keys
	// (pipeline.Decisions.KeysFrom); 0 means pipeline.DefaultKeysFrom.
	KeysFrom int
	// Pipelines is the most pipelines of coalesced calls in flight at once,
	// each on a pooled connection. 0 means DefaultPipelines.
	Pipelines int
	// MaxBatch is the most calls in one pipeline. 0 means DefaultMaxBatch.
	MaxBatch int
}

// coalescer queues the Run calls that arrive while another is in flight,
// for flusher goroutines to send in pipelines.
type coalescer struct {
	pipelines, maxBatch int
	inflight            atomic.Int64 // Run calls in flight, direct or queued

	mu       sync.Mutex
	queue    []*pending
	flushers int // flusher goroutines running
	busy     int // flushers sending a pipeline; the others are about to take the queue

	batches, calls atomic.Int64 // pipelines sent and the calls in them, for tests
}

// newCoalescer returns a coalescer with o's settings, defaults for those
// not positive.
func newCoalescer(o StoreOptions) *coalescer {
	co := &coalescer{pipelines: o.Pipelines, maxBatch: o.MaxBatch}
	if co.pipelines <= 0 {
		co.pipelines = DefaultPipelines
	}
	if co.maxBatch <= 0 {
		co.maxBatch = DefaultMaxBatch
	}
	return co
}

// A pending is one queued Run call. Its caller reuses it only after it has
// received the call's outcome: a flusher does not touch it once it has
// sent on done.
type pending struct {
	ctx   context.Context
	call  driver.Call
	stall *time.Timer            // fires stallAfter after the call was queued: see kick
	kv    []string               // the call's keys then args, copied
	done  chan driver.CallResult // buffered: a flusher never waits for the caller
}

var pendingPool = sync.Pool{New: func() any {
	p := &pending{done: make(chan driver.CallResult, 1), stall: time.NewTimer(stallAfter)}
	p.stall.Stop()
	return p
}}

// DirectCalls is how many Run calls in flight on a Store are sent on
// their own, each on a pooled connection, before calls are queued for
// pipelines (see StoreOptions): pipeline.DirectCalls, chosen with the
// benchmark harness, as rueidis.LoneCalls.
const DirectCalls = pipeline.DirectCalls

// runCoalesced is Run on a Store that coalesces: on its own when at most
// DirectCalls are in flight, else queued for a pipeline.
func (s *Store) runCoalesced(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	co := s.co
	n := co.inflight.Add(1)
	defer co.inflight.Add(-1)
	if n <= DirectCalls {
		return s.runDirect(ctx, sc, keys, args)
	}
	if err := ctx.Err(); err != nil {
		return nil, classify(sc.Name(), err) // not sent
	}
	p := pendingPool.Get().(*pending)
	p.ctx = ctx
	// A copy: a caller that gives up may reuse its slices while the call
	// is sent.
	p.kv = append(append(p.kv[:0], keys...), args...)
	p.call = driver.Call{Script: sc, Keys: p.kv[:len(keys):len(keys)], Args: p.kv[len(keys):]}
	s.enqueue(p)
	p.stall.Reset(stallAfter)
	for {
		select {
		case <-p.stall.C:
			s.kick()
			continue
		case r := <-p.done:
			p.stall.Stop()
			return s.received(ctx, p, r, sc, keys, args)
		case <-ctx.Done():
			p.stall.Stop()
			// The call may be in a pipeline already, so its outcome is
			// unknown, as for a direct call that timed out after it was
			// sent. p stays with its flusher and is not reused.
			return nil, classify(sc.Name(), ctx.Err())
		}
	}
}

// received returns the outcome r of p's call to its caller and p to the
// pool.
func (s *Store) received(ctx context.Context, p *pending, r driver.CallResult, sc *driver.Script, keys, args []string) ([]int64, error) {
	clear(p.kv)
	p.ctx, p.call = nil, driver.Call{}
	pendingPool.Put(p)
	if r.Err != nil && redis.HasErrorPrefix(r.Err, "NOSCRIPT") {
		// Not run: the script cache was flushed again between RunMany's
		// SCRIPT LOAD and its second sending. EVAL cannot meet NOSCRIPT.
		return s.runDirect(ctx, sc, keys, args)
	}
	return r.Reply, r.Err
}

// stallAfter and maxStallFlushers bound head-of-line waiting. A queued call
// waits for a flusher, and with Pipelines in flight a flusher is free only
// when a pipeline's round trip ends: on a slow link (200 ms each way) a
// call would wait a whole round trip before it is even sent, and then miss
// its deadline. So a call still waiting after stallAfter starts one more
// flusher if every flusher is busy, up to maxStallFlushers: on a slow link
// calls are then sent about as they come, as without coalescing. An extra
// flusher leaves after its pipeline.
const (
	stallAfter       = pipeline.DefaultStallAfter
	maxStallFlushers = 64
)

// enqueue queues p and starts a flusher unless one is about to take the
// queue or Pipelines are running.
func (s *Store) enqueue(p *pending) {
	co := s.co
	co.mu.Lock()
	co.queue = append(co.queue, p)
	start := co.claimLocked(co.pipelines)
	co.mu.Unlock()
	if start {
		go s.flush()
	}
}

// claimLocked reports whether a new flusher is needed, and counts it: calls
// are queued, no flusher is about to take them, and fewer than limit run.
// co.mu is held.
func (co *coalescer) claimLocked(limit int) bool {
	if len(co.queue) == 0 || co.flushers != co.busy || co.flushers >= limit {
		return false
	}
	co.flushers++
	return true
}

// kick starts one more flusher for a call that has waited stallAfter, if
// calls are queued and every flusher is busy.
func (s *Store) kick() {
	co := s.co
	co.mu.Lock()
	start := co.claimLocked(maxStallFlushers)
	co.mu.Unlock()
	if start {
		go s.flush()
	}
}

// flush is a flusher goroutine: it sends up to MaxBatch queued calls in one
// pipeline at a time, and exits when it finds the queue empty.
func (s *Store) flush() {
	co := s.co
	var batch []*pending
	co.mu.Lock()
	for {
		n := min(len(co.queue), co.maxBatch)
		if n == 0 {
			co.flushers--
			co.mu.Unlock()
			return
		}
		batch = append(batch[:0], co.queue[:n]...)
		rest := copy(co.queue, co.queue[n:])
		clear(co.queue[rest:])
		co.queue = co.queue[:rest]
		co.busy++
		// The calls left over wait for another flusher.
		start := co.claimLocked(co.pipelines)
		co.mu.Unlock()
		if start {
			go s.flush()
		}
		s.send(batch)
		clear(batch)
		co.mu.Lock()
		co.busy--
		if co.flushers > co.pipelines {
			// An extra flusher of a stall.
			co.flushers--
			co.mu.Unlock()
			return
		}
	}
}

// send sends the calls of batch whose context has not ended in one
// pipeline (RunMany: NOSCRIPT, chunking and error mapping as there) and
// gives each caller its outcome; a failed pipeline gives each its error.
// The calls whose context has ended get that error, unsent. The pipeline's
// deadline is the latest of its calls', so that a call with a short
// deadline does not fail the others; with a call without a deadline it has
// none, and the client's ReadTimeout bounds it.
func (s *Store) send(batch []*pending) {
	live := batch[:0]
	calls := make([]driver.Call, 0, len(batch))
	var latest time.Time
	forever := false
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.done <- driver.CallResult{Err: classify(p.call.Script.Name(), err)}
			continue
		}
		if d, ok := p.ctx.Deadline(); !ok {
			forever = true
		} else if d.After(latest) {
			latest = d
		}
		live = append(live, p)
		calls = append(calls, p.call)
	}
	if len(live) == 0 {
		return
	}
	// Not a caller's context: a caller that gives up must not fail the
	// others.
	ctx := context.Background()
	if !forever {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	s.co.batches.Add(1)
	s.co.calls.Add(int64(len(calls)))
	out := s.RunMany(ctx, calls)
	for i, p := range live {
		p.done <- out[i]
	}
}

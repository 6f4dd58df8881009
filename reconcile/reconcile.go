// Package reconcile folds the grants an instance made during a Redis outage
// back into Redis, exactly once: one atomic script per key and batch, which
// marks the batch applied (SET NX with a TTL) in the same call. The script
// is the algorithm's own (core.Replayer, next to its decision script); this
// package chooses the marker and merge-log keys and sends the calls. What
// the two built-in algorithms do:
//
// Token bucket: the grants are replayed in time order against the stored
// bucket (one integer, the instant its credit is zero: tokenbucket.State.
// Empty), refilling between grants; the balance may become a debt of at most
// one full bucket at the replay's Redis time. The result never leaves more
// tokens than one global bucket fed the same grants would (see
// tokenbucket.Replay and its property test), so an over-admitting outage is
// paid back, never forgotten.
//
// Sliding window: each grant's units are added with their original
// admission time and request id, so they count where they happened and a
// replay adds nothing twice; units already outside the window are skipped.
//
// Batches are sent concurrently (pipelined by the client), so a large log
// costs about one round trip per Concurrency batches.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast/core"
)

// ErrUnknownAlgorithm reports a batch whose policy has no replay script.
var ErrUnknownAlgorithm = errors.New("reconcile: no replay for algorithm")

// Options configures a Reconciler. Zero values mean the defaults.
type Options struct {
	// MarkerTTL is how long a batch stays marked applied. It must outlast
	// any retry of the batch, including one after a process restart. 0 means
	// 24 hours.
	MarkerTTL time.Duration
	// Concurrency is how many batches are in flight at once. 0 means 256.
	Concurrency int
	// CallTimeout bounds each batch's call. 0 means 2 seconds.
	CallTimeout time.Duration
	// MergeWindow is how long a recovery's merge log lives from its first
	// batch: token bucket batches replayed within it are charged as one
	// global bucket; a batch after it starts a new log. It must end before
	// decisions through Redis resume. 0 means 1 second.
	MergeWindow time.Duration
}

// Reconciler replays outage logs into a store. It is safe for concurrent
// use.
type Reconciler struct {
	o Options
}

var _ core.Reconciler = (*Reconciler)(nil)

// New returns a Reconciler.
func New(o Options) *Reconciler {
	if o.MarkerTTL <= 0 {
		o.MarkerTTL = 24 * time.Hour
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 256
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 2 * time.Second
	}
	if o.MergeWindow <= 0 {
		o.MergeWindow = time.Second
	}
	return &Reconciler{o: o}
}

// MergeKey is the key of storage key key's merge log during a recovery.
func MergeKey(key string) string { return key + ":rl" }

// MarkerKey is the key that marks batch id of storage key key as applied.
// It shares key's hash tag, so both live in one Redis Cluster slot.
func MarkerKey(key, id string) string { return key + ":rb:" + id }

// Reconcile applies each batch once; see core.Reconciler. A store that
// pipelines (core.Pipeliner) gets all batches in one RunMany, which it sends
// in pipelines of its own size; others get Concurrency calls in flight.
func (r *Reconciler) Reconcile(ctx context.Context, store core.Store, batches []core.Batch) []error {
	errs := make([]error, len(batches))
	if pl, ok := store.(core.Pipeliner); ok && len(batches) > 1 {
		r.pipelined(ctx, pl, batches, errs)
		return errs
	}
	sem := make(chan struct{}, r.o.Concurrency)
	var wg sync.WaitGroup
	for i := range batches {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = r.apply(ctx, store, &batches[i])
		})
	}
	wg.Wait()
	return errs
}

// pipelined sends the batches through the store's pipelines. The deadline
// grows with the number of batches: a pipeline's worth per CallTimeout.
func (r *Reconciler) pipelined(ctx context.Context, pl core.Pipeliner, batches []core.Batch, errs []error) {
	calls := make([]core.Call, 0, len(batches))
	idx := make([]int, 0, len(batches))
	for i := range batches {
		c, err := r.call(&batches[i])
		if err != nil {
			errs[i] = err
			continue
		}
		calls, idx = append(calls, c), append(idx, i)
	}
	timeout := r.o.CallTimeout * time.Duration(1+len(calls)/10_000)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for j, res := range pl.RunMany(ctx, calls) {
		errs[idx[j]] = check(&batches[idx[j]], res.Reply, res.Err)
	}
}

// apply sends one batch.
func (r *Reconciler) apply(ctx context.Context, store core.Store, b *core.Batch) error {
	c, err := r.call(b)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.CallTimeout)
	defer cancel()
	reply, err := store.Run(ctx, c.Script, c.Keys, c.Args)
	return check(b, reply, err)
}

// check turns a batch's reply into its acknowledgement. A reply of "applied
// before" is an acknowledgement too: an earlier attempt counted the batch.
func check(b *core.Batch, reply []int64, err error) error {
	if err != nil {
		return fmt.Errorf("reconcile batch %s: %w", b.ID, err)
	}
	if len(reply) < 2 || (reply[0] != 0 && reply[0] != 1) {
		return core.Errorf(core.ErrMalformedReply, "reconcile batch %s: reply %v", b.ID, reply)
	}
	return nil
}

// call builds the script call that replays batch b: its algorithm's
// (core.Replayer), with the marker and merge-log keys of this package.
func (r *Reconciler) call(b *core.Batch) (core.Call, error) {
	p := b.Policy
	if !p.Valid() {
		return core.Call{}, core.Errorf(core.ErrInvalidPolicy, "batch %s has a zero policy", b.ID)
	}
	rp, ok := p.Algorithm().(core.Replayer)
	if !ok {
		return core.Call{}, fmt.Errorf("%w %q (batch %s)", ErrUnknownAlgorithm, p.Algorithm().Name(), b.ID)
	}
	return rp.ReplayCall(b, core.ReplayOptions{
		MarkerKey: MarkerKey(b.Key, b.ID), MarkerTTL: r.o.MarkerTTL,
		MergeKey: MergeKey(b.Key), MergeWindow: r.o.MergeWindow,
	}), nil
}

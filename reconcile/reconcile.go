// Package reconcile folds the grants an instance made during a Redis outage
// back into Redis, exactly once: one atomic script run per key and batch,
// which marks the batch applied (SET NX with a TTL) in the same run. The script
// is the algorithm's own (driver.Replayer, next to its decision script); this
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
// Batches whose keys share a Redis Cluster hash slot go several to a call
// (driver.MultiReplayer: each batch's own script, run once per batch in one
// call, so each checks its marker first and sets it last as it would
// alone), and the calls are sent concurrently (pipelined by the client,
// in chunks of its own size).
//
// What a replay costs is the script's work per key, not the call: on one
// local Redis 7.0 (go test -bench BenchmarkReconcile ./reconcile, 100k
// keys), a token bucket batch of three grants costs about 15 µs of Redis
// CPU (eight commands; three keys created: the bucket, its merge log and
// the marker), a sliding window's 11 µs and a counter's 9 µs, and 16 or 64
// batches a call were within the noise of one a call. DefaultMultiBatches
// is 16: it bounds a call's Redis time to about a quarter of a
// millisecond, which a decision made meanwhile may wait behind it.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
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
	// MultiBatches is the most batches in one multi-batch call (see
	// Reconcile); 1 sends each batch in a call of its own. 0 means
	// DefaultMultiBatches.
	MultiBatches int
	// MultiArgs is the most keys and arguments in one multi-batch call;
	// a batch with more than half of it is sent on its own. 0 means
	// DefaultMultiArgs.
	MultiArgs int
}

// Defaults of Options: see the package comment.
const (
	DefaultMultiBatches = 16
	DefaultMultiArgs    = 2048
)

// Reconciler replays outage logs into a store. It is safe for concurrent
// use.
type Reconciler struct {
	o Options
}

var _ driver.Reconciler = (*Reconciler)(nil)

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
	if o.MultiBatches <= 0 {
		o.MultiBatches = DefaultMultiBatches
	}
	if o.MultiArgs <= 0 {
		o.MultiArgs = DefaultMultiArgs
	}
	return &Reconciler{o: o}
}

// MergeKey is the key of storage key key's merge log during a recovery.
func MergeKey(key string) string { return key + ":rl" }

// MarkerKey is the key that marks batch id of storage key key as applied.
// It shares key's hash tag, so both live in one Redis Cluster slot.
func MarkerKey(key, id string) string { return key + ":rb:" + id }

// Reconcile applies each batch once; see driver.Reconciler. Batches of an
// algorithm that is a driver.MultiReplayer go several to a call: those whose
// keys share a hash slot, up to MultiBatches batches and MultiArgs
// arguments a call. A store that pipelines (driver.Pipeliner) gets all calls
// in one RunMany, which it sends in pipelines of its own size; others get
// Concurrency calls in flight.
func (r *Reconciler) Reconcile(ctx context.Context, store driver.Store, batches []driver.Batch) []error {
	errs := make([]error, len(batches))
	units := r.plan(batches, errs)
	alone := r.send(ctx, store, batches, units, errs)
	if len(alone) > 0 {
		// A batch whose multi-batch call failed with a reply of Redis, or
		// whose replay in it replied an error, is sent once more on its
		// own: its own call gives it its own error, and a batch the
		// failed call applied before the failure is acknowledged by its
		// marker.
		again := make([]unit, len(alone))
		for j, i := range alone {
			c, _ := r.call(&batches[i])
			again[j] = unit{call: c, batches: []int{i}}
		}
		r.send(ctx, store, batches, again, errs)
	}
	return errs
}

// A unit is one script call: one batch's own call, or a multi-batch call
// of several (multi true).
type unit struct {
	call    driver.Call
	batches []int
	multi   bool
}

// group names the batches that may share a multi-batch call: one script,
// one hash slot.
type group struct {
	script *driver.Script
	slot   int
}

// plan returns the calls that replay batches: a multi-batch call for the
// batches of one group, up to the bounds of a call, and a call of its own
// for every other batch. A batch that cannot be replayed gets its error.
func (r *Reconciler) plan(batches []driver.Batch, errs []error) []unit {
	units := make([]unit, 0, len(batches))
	parts := make([][]driver.Call, 0) // each multi unit's calls, by unit
	open := map[group]int{}           // the unit a group is filling
	weight := make([]int, 0)          // each multi unit's keys and arguments
	for i := range batches {
		b := &batches[i]
		c, err := r.call(b)
		if err != nil {
			errs[i] = err
			continue
		}
		mr, ok := b.Policy.Algorithm().(driver.MultiReplayer)
		w := len(c.Keys) + len(c.Args) + 2
		if !ok || r.o.MultiBatches == 1 || w > r.o.MultiArgs/2 {
			units = append(units, unit{call: c, batches: []int{i}})
			parts, weight = append(parts, nil), append(weight, 0)
			continue
		}
		g := group{script: mr.MultiReplayScript(), slot: driver.HashSlot(b.Key)}
		if u, ok := open[g]; ok && len(units[u].batches) < r.o.MultiBatches && weight[u]+w <= r.o.MultiArgs {
			units[u].batches = append(units[u].batches, i)
			parts[u], weight[u] = append(parts[u], c), weight[u]+w
			continue
		}
		open[g] = len(units)
		units = append(units, unit{call: driver.Call{Script: g.script}, batches: []int{i}, multi: true})
		parts, weight = append(parts, []driver.Call{c}), append(weight, w)
	}
	for u := range units {
		switch {
		case !units[u].multi:
		case len(parts[u]) == 1:
			// One batch: its own call, without the loop's arguments.
			units[u].call, units[u].multi = parts[u][0], false
		default:
			units[u].call = driver.MultiCall(units[u].call.Script, parts[u])
		}
	}
	return units
}

// send runs the units' calls and records each batch's outcome in errs. It
// returns the batches to send again on their own.
func (r *Reconciler) send(ctx context.Context, store driver.Store, batches []driver.Batch, units []unit, errs []error) (alone []int) {
	results := make([]driver.CallResult, len(units))
	if pl, ok := store.(driver.Pipeliner); ok && len(units) > 1 {
		calls := make([]driver.Call, len(units))
		n := 0
		for u := range units {
			calls[u] = units[u].call
			n += len(units[u].batches)
		}
		// The deadline grows with the number of batches: 10,000 per
		// CallTimeout.
		ctx, cancel := context.WithTimeout(ctx, r.o.CallTimeout*time.Duration(1+n/10_000))
		defer cancel()
		results = pl.RunMany(ctx, calls)
	} else {
		sem := make(chan struct{}, r.o.Concurrency)
		var wg sync.WaitGroup
		for u := range units {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(ctx, r.o.CallTimeout)
				defer cancel()
				c := units[u].call
				results[u].Reply, results[u].Err = store.Run(ctx, c.Script, c.Keys, c.Args)
			})
		}
		wg.Wait()
	}
	for u := range units {
		alone = append(alone, r.outcome(batches, &units[u], results[u], errs)...)
	}
	return alone
}

// outcome records the outcome res of unit u's call in errs, and returns the
// batches to send again on their own.
func (r *Reconciler) outcome(batches []driver.Batch, u *unit, res driver.CallResult, errs []error) (alone []int) {
	if !u.multi {
		i := u.batches[0]
		errs[i] = check(&batches[i], res.Reply, res.Err)
		return nil
	}
	if res.Err != nil {
		var se *core.StoreError
		if errors.As(res.Err, &se) && se.Answered && se.Class != core.ClassUnavailable {
			// Redis ran the call and a batch's replay failed in it: the
			// batches before it are applied and marked.
			return u.batches
		}
		for _, i := range u.batches {
			errs[i] = check(&batches[i], nil, res.Err)
		}
		return nil
	}
	replies, ok := driver.SplitReply(res.Reply, len(u.batches))
	for j, i := range u.batches {
		switch {
		case !ok:
			errs[i] = driver.Errorf(core.ErrMalformedReply, "reconcile batch %s: multi-batch reply %v", batches[i].ID, res.Reply)
		case replies[j] == nil:
			alone = append(alone, i)
		default:
			errs[i] = check(&batches[i], replies[j], nil)
		}
	}
	return alone
}

// check turns a batch's reply into its acknowledgement. A reply of "applied
// before" is an acknowledgement too: an earlier attempt counted the batch.
func check(b *driver.Batch, reply []int64, err error) error {
	if err != nil {
		return fmt.Errorf("reconcile batch %s: %w", b.ID, err)
	}
	if len(reply) < 2 || (reply[0] != 0 && reply[0] != 1) {
		return driver.Errorf(core.ErrMalformedReply, "reconcile batch %s: reply %v", b.ID, reply)
	}
	return nil
}

// call builds the script call that replays batch b: its algorithm's
// (driver.Replayer), with the marker and merge-log keys of this package.
func (r *Reconciler) call(b *driver.Batch) (driver.Call, error) {
	p := b.Policy
	if !p.Valid() {
		return driver.Call{}, driver.Errorf(core.ErrInvalidPolicy, "batch %s has a zero policy", b.ID)
	}
	rp, ok := p.Algorithm().(driver.Replayer)
	if !ok {
		return driver.Call{}, fmt.Errorf("%w %q (batch %s)", ErrUnknownAlgorithm, p.Algorithm().Name(), b.ID)
	}
	return rp.ReplayCall(b, driver.ReplayOptions{
		MarkerKey: MarkerKey(b.Key, b.ID), MarkerTTL: r.o.MarkerTTL,
		MergeKey: MergeKey(b.Key), MergeWindow: r.o.MergeWindow,
	}), nil
}

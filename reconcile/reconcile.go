// Package reconcile folds the grants an instance made during a Redis outage
// back into Redis, exactly once: one atomic script per key and batch, which
// marks the batch applied (SET NX with a TTL) in the same call.
//
// Token bucket: the grants are replayed in time order against the stored
// bucket (one integer, the instant its credit is zero: tokenbucket.State.
// Empty), refilling between grants; the balance may become a debt of at most
// one full bucket at the replay's Redis time. The result never leaves more
// tokens than one global bucket fed the same grants would (see
// ReplayTokenBucket and its property test), so an over-admitting outage is
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
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
)

var (
	//go:embed tokenbucket.lua
	tbSource string
	//go:embed slidingwindow.lua
	swSource string

	// TokenBucketScript is the token bucket replay script.
	TokenBucketScript = core.NewScript("reconcile_token_bucket", tbSource, nil)
	// SlidingWindowScript is the sliding window replay script.
	SlidingWindowScript = core.NewScript("reconcile_sliding_window", swSource, nil)
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

// call builds the script call that replays batch b.
func (r *Reconciler) call(b *core.Batch) (core.Call, error) {
	p := b.Policy
	if !p.Valid() {
		return core.Call{}, core.Errorf(core.ErrInvalidPolicy, "batch %s has a zero policy", b.ID)
	}
	ttl := strconv.FormatInt(r.o.MarkerTTL.Milliseconds(), 10)
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	keys := []string{b.Key, MarkerKey(b.Key, b.ID)}
	switch p.Algorithm().Name() {
	case tokenbucket.Name:
		args := make([]string, 0, 6+2*len(b.Grants))
		args = append(args, i64(p.Limit()), i64(p.Interval().Microseconds()), ttl, i64(b.Seed.Value), i64(b.Seed.At),
			i64(r.o.MergeWindow.Milliseconds()))
		for _, g := range b.Grants {
			args = append(args, i64(g.At), i64(g.Cost))
		}
		return core.Call{Script: TokenBucketScript, Keys: append(keys, MergeKey(b.Key)), Args: args}, nil
	case slidingwindow.Name:
		args := make([]string, 0, 5+3*len(b.Grants))
		// The seed's member prefix only when there are seed units: every
		// distinct argument is a new string for the script's Lua heap.
		prefix := ""
		if b.Seed.Value > 0 && b.Seed.At > 0 {
			prefix = "seed:" + b.ID + ":"
		}
		args = append(args, i64(p.Interval().Microseconds()), ttl, i64(b.Seed.Value), i64(b.Seed.At), prefix)
		for _, g := range b.Grants {
			args = append(args, i64(g.At), i64(g.Cost), g.ID)
		}
		return core.Call{Script: SlidingWindowScript, Keys: keys, Args: args}, nil
	}
	return core.Call{}, fmt.Errorf("%w %q (batch %s)", ErrUnknownAlgorithm, p.Algorithm().Name(), b.ID)
}

// MergeLog is the Go model of a recovery's merge log: the bucket as it stood
// when the first batch arrived (its tokenbucket.State.Empty), and every grant
// replayed since.
type MergeLog struct {
	Started bool
	Base    int64
	Grants  []core.Grant
}

// ReplayTokenBucket is the Go model of tokenbucket.lua's replay, for tests
// and reasoning: it charges batch grants to the bucket whose Empty is cur
// (ok false when the key is missing; seed used then) of capacity c and
// interval t, with the recovery's merge log m, at store time now, and
// returns the new bucket's Empty.
func ReplayTokenBucket(cur int64, ok bool, seed core.Seed, m *MergeLog, c, t, now int64, grants []core.Grant) int64 {
	full := c * t
	switch {
	case ok:
	case seed.At > 0:
		cur = seed.At - seed.Value
	default:
		cur = -full // full at any time since the epoch
	}
	if !m.Started {
		m.Started, m.Base = true, cur
	}
	prev := slices.Clone(m.Grants)
	m.Grants = append(m.Grants, grants...)
	all := slices.Clone(m.Grants)
	byTime := func(a, b core.Grant) int { return cmp.Compare(a.At, b.At) }
	slices.SortStableFunc(prev, byTime)
	slices.SortStableFunc(all, byTime)
	// run feeds grants in time order to the base bucket: at each grant it
	// holds min(full, At − e), and the grant spends its cost.
	run := func(gs []core.Grant) int64 {
		e := m.Base
		for _, g := range gs {
			e = max(e, g.At-full) + g.Cost*t
		}
		return e
	}
	x := now
	if len(all) > 0 {
		x = all[len(all)-1].At
		withAll, without := run(all), run(prev)
		cur = max(cur, x-full) + withAll - max(without, x-full)
	}
	return min(cur, max(now, x)+full)
}

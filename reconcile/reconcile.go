// Package reconcile folds the grants an instance made during a Redis outage
// back into Redis, exactly once. The replay scripts are the algorithms' own
// (driver.Replayer, next to their decision scripts, each wrapped by
// driver.NewReplayScript); this package groups the batches into calls,
// names the markers and sends the calls. What the built-in algorithms do:
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
// Batches of one instance (and, on Redis Cluster, of one hash slot) go up
// to MultiBatches to a call: each batch's body runs once, and the batches'
// markers are fields of one hash, read before and set after them (see
// markerOf). The calls are sent concurrently (pipelined by the client, in
// chunks of its own size).
//
// A replay of FreshMin batches or more sends the batches of a
// driver.FreshReplayer in fresh calls first (driver.FreshScript): a key
// Redis lost (restarted empty) is written with the plain commands the
// algorithm computed in the client, under the same markers, and a key
// that exists goes to the replay script (see Reconcile). To a store that
// is a driver.Commander it sends the batches of a driver.PlainReplayer
// (the sliding window's, without seed units) as plain commands before
// that, with neither script nor marker: they add nothing when applied
// again.
//
// What a replay costs is mostly Redis's work per key: on one local Redis
// 7.0 (make bench, BENCHMARKS.md section 4: 100k keys of three grants), a
// token bucket batch costs about 4 µs of Redis CPU in a fresh call (its
// SET, and a share of the call's HMGET, EXISTS and HSET) and about 5.5 µs
// in its replay script (a GET and a SET of its key, and a share of its
// call's HMGET, HSET and TIME); go test -bench BenchmarkReconcile
// ./reconcile measures the same. The client builds the next calls while
// Redis runs the last ones (see Reconcile), so the replay takes about that
// CPU time.
// DefaultMultiBatches is 32: a call's fixed work (its markers' HMGET and
// HSET, TIME, the script's start) is spread over more keys than at 16
// (48 and 64 measured no better), and a call's Redis time stays well
// under a millisecond, which a decision made meanwhile may wait behind.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// MultiArgs is the most keys and arguments in one call of several
	// batches: a batch that would take a call past it starts the next
	// call, and a batch of more goes alone. 0 means DefaultMultiArgs.
	MultiArgs int
	// FreshMin is the fewest batches a Reconcile sends as plain writes
	// and to driver.FreshScript first (see Reconcile); a negative FreshMin
	// sends every batch to its replay script. 0 means DefaultFreshMin.
	FreshMin int
}

// Defaults of Options: see the package comment.
const (
	DefaultMultiBatches = 32
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
	if o.FreshMin == 0 {
		o.FreshMin = DefaultFreshMin
	}
	return &Reconciler{o: o}
}

// Reconcile applies each batch once; see driver.Reconciler. Batches go
// several to a call when they share a replay script and a marker hash
// (one instance's batches, and on Redis Cluster one hash slot: see
// markerOf), up to MultiBatches batches and MultiArgs arguments a call.
// The batches are taken streamSlice at a time: a slice's calls are sent
// while the next slice's are built, at most streamDepth slices in flight,
// so Redis works while the client builds. A store that pipelines
// (driver.Pipeliner) gets each slice's calls in one RunMany, which it
// sends in pipelines of its own size; others get at most Concurrency
// calls in flight.
//
// A Reconcile of FreshMin batches or more first sends the batches of a
// driver.FreshReplayer in driver.FreshScript calls, which write the keys
// that are missing with plain commands and leave the others to the replay
// script: after Redis restarted empty that is every key, at a quarter to a
// third less Redis time a key. Both calls keep the same markers, so a batch counts
// once whichever applied it. While most keys of a slice exist (a replay
// after a partition, into a Redis that kept its keys), the slices after it
// go to the replay script at once.
//
// Before that, under the same conditions, the batches of a
// driver.PlainReplayer go as plain commands to a store that is a
// driver.Commander (see driver.PlainReplayer): a batch is acknowledged
// when its commands all succeeded, stays unacknowledged when Redis did not
// answer one, and goes to the scripts when Redis refused one; once most of
// a slice's were refused, the slices after it go to the scripts at once. A
// batch whose key is also the key of a batch for the scripts (which may
// write a seed into a missing key) goes there with it.
func (r *Reconciler) Reconcile(ctx context.Context, store driver.Store, batches []driver.Batch) []error {
	errs := make([]error, len(batches))
	cluster := driver.OnCluster(store)
	var (
		prep     = make([]prepared, len(batches))
		sem      = make(chan struct{}, r.o.Concurrency)
		inflight = make(chan struct{}, streamDepth)
		wg       sync.WaitGroup
		mu       sync.Mutex
		alone    []int
	)
	clock := r.freshClock(ctx, store, len(batches), cluster)
	var existing atomic.Bool // most keys of a fresh slice existed
	var plainOff atomic.Bool // most plain batches of a slice were refused
	cm, _ := store.(driver.Commander)
	for lo := 0; lo < len(batches); lo += streamSlice {
		hi := min(lo+streamSlice, len(batches))
		sub, subErrs, subPrep := batches[lo:hi], errs[lo:hi], prep[lo:hi]
		var (
			plain plainWrites
			fresh []unit
		)
		rest := make([]int, hi-lo)
		for i := range rest {
			rest[i] = i
		}
		if clock != nil && cm != nil && !plainOff.Load() {
			plain, rest = r.preparePlain(sub, rest, clock())
		}
		if clock != nil && !existing.Load() {
			fresh, rest = r.prepareFresh(sub, rest, cluster, clock(), subPrep, make([]int, 0, len(rest)))
		}
		r.prepare(sub, rest, cluster, subErrs, subPrep)
		units := r.plan(subPrep, rest)
		inflight <- struct{}{}
		wg.Go(func() {
			defer func() { <-inflight }()
			if len(plain.of) > 0 {
				again := r.sendPlain(ctx, cm, sub, plain, subErrs, &plainOff)
				r.prepare(sub, again, cluster, subErrs, subPrep)
				units = append(units, r.plan(subPrep, again)...)
			}
			if len(fresh) > 0 {
				again := r.sendFresh(ctx, store, sub, fresh, subErrs, sem, &existing)
				r.prepare(sub, again, cluster, subErrs, subPrep)
				units = append(units, r.plan(subPrep, again)...)
			}
			a := r.send(ctx, store, sub, units, subErrs, sem)
			mu.Lock()
			for _, i := range a {
				alone = append(alone, lo+i)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(alone) > 0 {
		// A batch whose call of several failed with a reply of Redis, or
		// whose body failed in it, is sent once more on its own: its own
		// call gives it its own error, and a batch the failed call
		// applied and marked is acknowledged by its marker.
		slices.Sort(alone)
		again := make([]unit, len(alone))
		for j, i := range alone {
			again[j] = prep[i].unit(r.o.MarkerTTL, []int{i}, prep)
		}
		r.send(ctx, store, batches, again, errs, sem)
	}
	return errs
}

// streamSlice is how many batches Reconcile builds calls for at a time,
// and streamDepth how many slices may be in flight: with the default
// MultiBatches, 32 calls a slice, a few pipelines ahead of Redis.
const (
	streamSlice = 1024
	streamDepth = 4
)

// A unit is one script call and the batches it applies.
type unit struct {
	call    driver.Call
	batches []int
}

// group names the batches that may share a call: one script, one marker
// hash, one policy's shared arguments (joined).
type group struct {
	script *driver.Script
	marker string
	shared string
}

// A prepared batch is what its calls need of it, built once: its group,
// its part of a call, and the keys and arguments that part adds. ok is
// false for a batch that cannot be replayed (its error is in errs).
type prepared struct {
	group  group
	shared []string
	batch  driver.ReplayBatch
	weight int
	ok     bool
}

// prepare builds the part of a call of each batch idx of batches, in
// prep; on Cluster (cluster) its marker hash is in the batch key's slot.
func (r *Reconciler) prepare(batches []driver.Batch, idx []int, cluster bool, errs []error, prep []prepared) {
	o := driver.ReplayOptions{MergeWindow: r.o.MergeWindow}
	var (
		last   driver.Policy // valid when have
		have   bool
		shared []string
		joined string
	)
	for _, i := range idx {
		b := &batches[i]
		rp, err := replayer(b)
		if err != nil {
			errs[i], prep[i] = err, prepared{}
			continue
		}
		if !have || !samePolicy(b.Policy, last) {
			last, have, shared = b.Policy, true, rp.ReplaySharedArgs(nil, b.Policy, o)
			joined = strings.Join(shared, "\x00")
		}
		marker, field := markerOf(b.Key, b.ID, cluster)
		args := rp.ReplayArgs(nil, b, o)
		prep[i] = preparedOf(group{script: rp.ReplayScript(), marker: marker, shared: joined}, shared,
			driver.ReplayBatch{Key: b.Key, Field: field, Args: args})
	}
}

// preparedOf is the prepared batch rb of group g, with its group's shared
// arguments: its weight is its key, its field, its count and its
// arguments.
func preparedOf(g group, shared []string, rb driver.ReplayBatch) prepared {
	return prepared{group: g, shared: shared, batch: rb, weight: 3 + len(rb.Args), ok: true}
}

// unit returns the call that applies the prepared batches idx, of p's
// group.
func (p *prepared) unit(ttl time.Duration, idx []int, prep []prepared) unit {
	rbs := make([]driver.ReplayBatch, len(idx))
	for j, i := range idx {
		rbs[j] = prep[i].batch
	}
	if p.group.script == driver.FreshScript {
		return unit{call: driver.FreshCall(p.group.marker, ttl, rbs), batches: idx}
	}
	return unit{call: driver.ReplayCall(p.group.script, p.group.marker, ttl, p.shared, rbs), batches: idx}
}

// samePolicy reports whether a and b are one policy: their fields, not
// ==, which an algorithm of a type Go cannot compare would panic on.
func samePolicy(a, b driver.Policy) bool {
	return a.Name() == b.Name() && a.Limit() == b.Limit() && a.Interval() == b.Interval() &&
		a.Algorithm().Name() == b.Algorithm().Name()
}

// plan returns the calls that replay the prepared batches idx: the
// batches of one group go together, up to MultiBatches and MultiArgs a
// call.
func (r *Reconciler) plan(prep []prepared, idx []int) []unit {
	var (
		units []unit
		first []int   // each group's first batch, by group
		parts [][]int // each group's open call, by group
		load  []int   // its keys and arguments
		index = map[group]int{}
	)
	flush := func(g int) {
		if len(parts[g]) > 0 {
			units = append(units, prep[first[g]].unit(r.o.MarkerTTL, parts[g], prep))
			parts[g], load[g] = nil, 0
		}
	}
	for _, i := range idx {
		if !prep[i].ok {
			continue
		}
		g, ok := index[prep[i].group]
		if !ok {
			g = len(first)
			index[prep[i].group] = g
			first, parts, load = append(first, i), append(parts, nil), append(load, 0)
		}
		w := prep[i].weight
		if len(parts[g]) >= r.o.MultiBatches || load[g]+w > r.o.MultiArgs {
			flush(g)
		}
		parts[g], load[g] = append(parts[g], i), load[g]+w
	}
	for g := range parts {
		flush(g)
	}
	return units
}

// send runs the units' calls and records each batch's outcome in errs,
// at most cap(sem) calls at once when the store does not pipeline. It
// returns the batches to send again on their own.
func (r *Reconciler) send(ctx context.Context, store driver.Store, batches []driver.Batch, units []unit, errs []error, sem chan struct{}) (alone []int) {
	results := r.run(ctx, store, units, sem)
	for u := range units {
		alone = append(alone, r.outcome(batches, &units[u], results[u], errs)...)
	}
	return alone
}

// run runs the units' calls, at most cap(sem) at once when the store does
// not pipeline.
func (r *Reconciler) run(ctx context.Context, store driver.Store, units []unit, sem chan struct{}) []driver.CallResult {
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
		return pl.RunMany(ctx, calls)
	}
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
	return results
}

// outcome records the outcome res of unit u's call in errs, and returns the
// batches to send again on their own.
func (r *Reconciler) outcome(batches []driver.Batch, u *unit, res driver.CallResult, errs []error) (alone []int) {
	if res.Err != nil {
		var se *core.StoreError
		if len(u.batches) > 1 && errors.As(res.Err, &se) && se.Answered && se.Class != core.ClassUnavailable {
			// Redis ran the call and it failed: each batch on its own
			// learns whether it was its own error.
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
			errs[i] = driver.Errorf(core.ErrMalformedReply, "reconcile batch %s: replay reply %v", batches[i].ID, res.Reply)
		case replies[j] == nil && len(u.batches) > 1:
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

// replayer returns batch b's algorithm as a Replayer.
func replayer(b *driver.Batch) (driver.Replayer, error) {
	p := b.Policy
	if !p.Valid() {
		return nil, driver.Errorf(core.ErrInvalidPolicy, "batch %s has a zero policy", b.ID)
	}
	rp, ok := p.Algorithm().(driver.Replayer)
	if !ok {
		return nil, fmt.Errorf("%w %q (batch %s)", ErrUnknownAlgorithm, p.Algorithm().Name(), b.ID)
	}
	return rp, nil
}

// markerChunk is how many consecutive batch sequence numbers of one
// instance share a marker hash.
const markerChunk = 4096

// restorePrefix starts the ID of a restore batch (RestoreID).
const restorePrefix = "restore:"

// RestoreID is the ID of the batch that writes storage key skey's known
// state back after the data loss that Redis's data epoch epoch names (the
// fallback layer's restore): every instance restoring that key after that
// loss uses it, so the first applies it and the others find it applied.
// The restores of one epoch share a marker hash (per slot on Cluster), so
// they go up to MultiBatches to a call and leave one hash behind, not one
// per key.
func RestoreID(epoch int64, skey string) string {
	return restorePrefix + strconv.FormatInt(epoch, 10) + "/" + skey
}

// RestoreGrantsID names the batch that writes back, after the same data
// loss as RestoreID, the grants on storage key skey that instance had
// replayed into Redis (and no known state includes): one per instance, as
// each writes back its own grants. It shares RestoreID's marker hash; its
// field, the key and "+" and the instance, is never a storage key's (those
// end in '}').
func RestoreGrantsID(epoch int64, skey, instance string) string {
	return RestoreID(epoch, skey) + "+" + instance
}

// markerOf returns the hash that marks batch id of storage key key
// applied, and the batch's field in it. The hash is named after the key's
// prefix (its text before the first '{', so an ACL key pattern on the
// prefix covers it), "rb:" and the batch id: an id that ends in ":" and a
// sequence number (the fallback layer's instance:process:seq) shares its
// hash with the markerChunk ids of its run of sequence numbers, its
// field being the number; a RestoreID shares its hash with the restores
// of its epoch, its field being the key; any other id has a hash of its
// own. On Redis Cluster the name carries the key's slot as a hash tag
// (driver.SlotTag), so the hash lives beside the key.
func markerOf(key, id string, cluster bool) (hash, field string) {
	prefix := key
	if i := strings.IndexByte(key, '{'); i >= 0 {
		prefix = key[:i]
	}
	group, field := id, "-"
	if rest, ok := strings.CutPrefix(id, restorePrefix); ok && strings.IndexByte(rest, '/') > 0 {
		i := strings.IndexByte(rest, '/')
		group, field = id[:len(restorePrefix)+i], rest[i+1:]
	} else if i := strings.LastIndexByte(id, ':'); i >= 0 {
		if seq, err := strconv.ParseUint(id[i+1:], 10, 64); err == nil {
			group, field = id[:i+1]+strconv.FormatUint(seq/markerChunk, 10), id[i+1:]
		}
	}
	if cluster {
		return prefix + "{" + driver.SlotTag(driver.HashSlot(key)) + "}:rb:" + group, field
	}
	return prefix + "rb:" + group, field
}

// MarkerOf is markerOf, for tests and operators: the hash that marks
// batch id of key applied, and its field in it.
func MarkerOf(key, id string, cluster bool) (hash, field string) { return markerOf(key, id, cluster) }

// Call returns the call that replays batch b alone, as Reconcile sends it
// to a store on Redis Cluster (cluster) or not.
func (r *Reconciler) Call(b *driver.Batch, cluster bool) (driver.Call, error) {
	var errs [1]error
	prep := make([]prepared, 1)
	r.prepare([]driver.Batch{*b}, []int{0}, cluster, errs[:], prep)
	if errs[0] != nil {
		return driver.Call{}, errs[0]
	}
	return prep[0].unit(r.o.MarkerTTL, []int{0}, prep).call, nil
}

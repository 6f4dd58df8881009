// Package memory is a driver.Store kept in this process: it runs each
// algorithm's Go twin under a per-key lock, with the keys held in a
// ristretto cache.
//
// Memory is bounded by Options.MaxBytes: every key is charged an estimate of
// its size (key, bookkeeping and algorithm state; a sliding window's state
// grows with the units in its window and is re-charged as it grows). When the
// bound is reached, ristretto evicts the keys its TinyLFU policy values least,
// or refuses to admit a new key that is rarer than what it would evict.
//
// Eviction forgets a key: its next request starts from a fresh quota, as if
// it had never been seen. Size MaxBytes for the number of keys that are
// active within one refill period or window, and a key is only forgotten
// when it is rarer than everything kept. A key whose state has returned to a
// fresh quota (a full bucket, an empty window) is dropped from the
// accounting, so idle keys cost nothing that matters.
//
// The store is a driver.DirectStore: a core.Limiter over it decides through
// RunDirect, which takes the policy, client key and cost as they are and
// calls the algorithm's typed twin (driver.DirectAlgorithm) on a state updated
// in place, so a decision on a key the store holds allocates nothing (Run,
// with its storage key, string ARGV and reply slice, still serves the other
// callers and gives the same decisions). Two details of that path:
//
//   - A stripe keeps the entry the cache last returned; while the cache
//     holds it (eviction and rejection mark an entry gone), lookups of that
//     key skip the cache, and one in countEvery still reaches it so that
//     TinyLFU keeps counting the key's uses.
//   - RunDirect reads the clock before taking the key's lock, so callers
//     contending for a hot key do not queue behind each other's clock reads.
//     Two decisions may then apply a few hundred nanoseconds out of clock
//     order. That never admits more: a token bucket decision made at an
//     earlier instant finds less credit (refill counts backwards as well),
//     a sliding window decision counts every unit already logged after its
//     instant; at most the later caller is refused what the skew would
//     have refilled.
package memory

import (
	"context"
	"errors"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/clock"
)

// DefaultMaxBytes is the memory bound when Options.MaxBytes is zero.
const DefaultMaxBytes = 64 << 20

// entryOverhead estimates what a key costs besides its name and state: the
// entry, ristretto's item and its frequency counters.
const entryOverhead = 200

const stripes = 256

// pendingLimit is how many new keys a stripe remembers before it waits for
// ristretto to apply its buffered inserts.
const pendingLimit = 64

// offerEvery is how many new keys a stripe holds before it offers them to
// the cache, all in a row. Ristretto takes a Set through a channel that its
// policy goroutine waits on, and a Set that finds it waiting wakes it: a
// futex wake, and that goroutine run on the other core, which a Redis on
// the same machine wanted. Offered one at a time at a lone caller's pace,
// every new key paid that wake-up (the fallback layer keeps each key it
// sees through Redis here, so on many keys that is every decision); offered
// offerEvery at a time, the goroutine wakes once and finds the rest
// waiting. Until they are offered the entries are found in the stripe's
// pending map, not charged to MaxBytes and not evictable: at most
// offerEvery-1 a stripe.
const offerEvery = 16

// Options configures a Store. The zero value of each field means its default.
type Options struct {
	// MaxBytes bounds the estimated memory of all keys. 0 means 64 MiB.
	MaxBytes int64
	// Clock is the time source. nil means the system's wall clock (as
	// time.Now, read without its monotonic part: cheaper, and the Redis
	// scripts' clock is a wall clock too).
	Clock func() time.Time
	// Micros, when set, is the time source in microseconds since the Unix
	// epoch, in place of Clock: no time.Time per decision.
	Micros func() int64
}

// Store is a driver.Store in process memory. It is safe for concurrent use.
type Store struct {
	cache *ristretto.Cache[string, *entry]
	now   func() int64 // microseconds since the Unix epoch
	seed  maphash.Seed
	locks [stripes]stripe
}

// stripe serialises the keys that hash to it. Ristretto applies inserts
// asynchronously, so a stripe keeps the entries it inserted until they are
// visible, and a key is never created twice.
type stripe struct {
	mu      sync.Mutex
	pending map[string]*entry
	held    []string // keys of pending not yet offered to the cache (offerEvery)
	key     []byte   // RunDirect's storage key, built under mu
	last    *entry   // the entry the cache last returned here
	lastKey []byte   // its key
	hits    uint32   // lookups of last that skipped the cache
	_       [28]byte // two cache lines a stripe
}

type entry struct {
	state   any
	expires int64       // microseconds; the state is void from then on
	cost    int32       // bytes, as charged to the cache
	gone    atomic.Bool // the cache evicted or rejected it
}

// countEvery: a key found as its stripe's last entry is still looked up in
// the cache once in countEvery lookups, so that the cache's TinyLFU policy
// keeps counting how often it is used. A cache lookup costs a hot key
// more than its decision: it pushes to ristretto's access buffer, which
// wakes ristretto's policy goroutine each time it fills. At 8 that was
// 15 ns of a 217 ns local decision (BenchmarkLocalDecision/hot_key in
// fallback); a run of a key's uses still counts once at its start, and a
// hot key's counters saturate either way.
const countEvery = 64

var (
	_ driver.Store       = (*Store)(nil)
	_ driver.DirectStore = (*Store)(nil)
)

// New returns a Store.
func New(opts Options) (*Store, error) {
	if opts.MaxBytes < 0 {
		return nil, errors.New("memory: MaxBytes is negative")
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	keys := max(opts.MaxBytes/entryOverhead, 64)
	gone := func(it *ristretto.Item[*entry]) {
		if it.Value != nil {
			it.Value.gone.Store(true)
		}
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, *entry]{
		NumCounters:        keys * 10,
		MaxCost:            opts.MaxBytes,
		BufferItems:        64,
		IgnoreInternalCost: true,
		OnEvict:            gone,
		OnReject:           gone,
	})
	if err != nil {
		return nil, err
	}
	s := &Store{cache: c, now: clock.WallMicros, seed: maphash.MakeSeed()}
	if clock := opts.Clock; clock != nil {
		s.now = func() int64 { return clock().UnixMicro() }
	}
	if opts.Micros != nil {
		s.now = opts.Micros
	}
	for i := range s.locks {
		s.locks[i].pending = make(map[string]*entry)
	}
	return s, nil
}

// Local reports true: decisions of this store are made in this process.
func (s *Store) Local() bool { return true }

// Close releases the cache's goroutines.
func (s *Store) Close() { s.cache.Close() }

// Run runs script sc's Go twin on keys[0] under the key's lock.
func (s *Store) Run(ctx context.Context, sc *driver.Script, keys []string, args []string) ([]int64, error) {
	f := sc.Local()
	if f == nil {
		return nil, errors.New("memory: script " + sc.Name() + " has no Go twin")
	}
	if len(keys) != 1 {
		return nil, errors.New("memory: script " + sc.Name() + " needs exactly one key")
	}
	if ctx == nil {
		return nil, core.ErrNilContext
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if sc.Guarded() {
		args = driver.TrimDeadline(args) // a local call is never late
	}
	var reply []int64
	var err error
	s.Update(keys[0], func(prev any, now int64) (any, int64) {
		var next any
		var ttl int64
		next, reply, ttl, err = f(prev, now, args)
		if err != nil {
			return prev, -1
		}
		return next, ttl
	})
	return reply, err
}

// Update runs f on key's state under the key's lock. f gets the state (nil
// when the key holds nothing or has expired) and the store's time in
// microseconds, and returns the next state and how long it lives in
// microseconds: 0 or a nil state forgets the key, a negative ttl leaves
// everything as it was.
func (s *Store) Update(key string, f func(prev any, nowMicros int64) (next any, ttlMicros int64)) {
	st := &s.locks[maphash.String(s.seed, key)%stripes]
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.now()
	e := s.lookup(st, key)
	next, ttl := f(live(e, now), now)
	s.save(st, key, true, e, next, now, ttl)
}

// UpdateParts is Update for the key StorageKey(prefix, policy, key), built
// in the stripe's buffer instead of allocated: updating a key the store
// holds allocates nothing (f must not keep the key it is not given).
func (s *Store) UpdateParts(prefix, policy, key string, f func(prev any, nowMicros int64) (next any, ttlMicros int64)) {
	st := s.stripeOf(prefix, policy, key)
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.now()
	skey := st.buildKey(prefix, policy, key)
	e := s.lookup(st, skey)
	next, ttl := f(live(e, now), now)
	s.save(st, skey, false, e, next, now, ttl)
}

// RunDirect decides one request of policy p for client key without a
// script call (driver.DirectStore): it builds the storage key in the
// stripe's buffer and calls the algorithm's typed Go twin, so a decision on
// a key the store holds allocates nothing. Algorithms that are not a
// driver.DirectAlgorithm are not handled.
func (s *Store) RunDirect(ctx context.Context, prefix string, p core.Policy, key string, cost int64) (driver.Reply, bool, error) {
	alg, ok := p.Algorithm().(driver.DirectAlgorithm)
	if !ok {
		return driver.Reply{}, false, nil
	}
	if err := driver.CheckRequest(p, key, cost); err != nil {
		return driver.Reply{}, true, err
	}
	if ctx == nil {
		return driver.Reply{}, true, core.ErrNilContext
	}
	if err := ctx.Err(); err != nil {
		return driver.Reply{}, true, err
	}
	st := s.stripeOf(prefix, p.Name(), key)
	// The clock is read before the lock, so that contending callers do not
	// wait on each other's clock reads (see the package comment).
	now := s.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	skey := st.buildKey(prefix, p.Name(), key)
	e := s.lookup(st, skey)
	var prev any
	if e != nil {
		prev = e.state // expired or not: Step may reuse it
	}
	next, r, ttl := alg.Step(p, prev, e != nil && now < e.expires, now, cost)
	s.save(st, skey, false, e, next, now, ttl)
	return r, true, nil
}

// stripeOf is the stripe of StorageKey(prefix, policy, key), the stripe
// Update picks for that string, found without allocating it.
func (s *Store) stripeOf(prefix, policy, key string) *stripe {
	var h uint64
	if n := len(prefix) + len(policy) + len(key) + 3; n <= 96 {
		var buf [96]byte
		h = maphash.Bytes(s.seed, driver.AppendStorageKey(buf[:0], prefix, policy, key))
	} else {
		// maphash sums the bytes written, however they are split.
		var mh maphash.Hash
		mh.SetSeed(s.seed)
		mh.WriteString(prefix)
		mh.WriteByte('{')
		mh.WriteString(policy)
		mh.WriteByte(':')
		mh.WriteString(key)
		mh.WriteByte('}')
		h = mh.Sum64()
	}
	return &s.locks[h%stripes]
}

// buildKey builds StorageKey(prefix, policy, key) in the stripe's buffer
// and returns a view of it: lookups do not keep it, and save copies it
// before keeping a new key. The stripe's lock must be held.
func (st *stripe) buildKey(prefix, policy, key string) string {
	st.key = driver.AppendStorageKey(st.key[:0], prefix, policy, key)
	return unsafe.String(unsafe.SliceData(st.key), len(st.key))
}

// live is e's state, or nil when there is none or it has expired.
func live(e *entry, now int64) any {
	if e != nil && now < e.expires {
		return e.state
	}
	return nil
}

// save stores the state next of key, whose entry is e (nil if none), as a
// step left it at now: see Update for next and ttl. owned says key may be
// kept; otherwise a new entry keeps a copy.
func (s *Store) save(st *stripe, key string, owned bool, e *entry, next any, now, ttl int64) {
	switch {
	case ttl < 0:
		return
	case next == nil || ttl == 0:
		if e != nil {
			e.state, e.expires = nil, 0
		}
		return
	case e == nil:
		if !owned {
			key = strings.Clone(key)
		}
		e = &entry{}
		s.insert(st, key, e, next)
	default:
		if c := cost(key, next); int64(c) > 2*int64(e.cost) {
			e.cost = c
			s.cache.Set(key, e, int64(c))
		}
	}
	e.state, e.expires = next, now+ttl
}

// lookup finds key's entry in the cache or among the stripe's pending ones.
// The entry the cache last returned in this stripe is kept at hand: while
// the cache holds it, lookups of its key skip the cache's (two hashes, a
// shared lock and its access buffer) but once in countEvery times, so that
// the cache's TinyLFU policy keeps counting the key's uses.
func (s *Store) lookup(st *stripe, key string) *entry {
	if e := st.last; e != nil && string(st.lastKey) == key && !e.gone.Load() {
		if st.hits++; st.hits%countEvery != 0 {
			return e
		}
	}
	if e, ok := s.cache.Get(key); ok {
		if e != st.last {
			st.last, st.lastKey = e, append(st.lastKey[:0], key...)
		}
		return e
	}
	return st.pending[key]
}

// insert adds a new entry. New entries are offered to the cache
// offerEvery at a time (see offerEvery). Once the stripe holds pendingLimit
// unconfirmed entries it waits for ristretto to apply them, offers the ones
// a full buffer dropped once more, and forgets the rest: entries the
// cache's policy rejected are forgotten like evicted ones.
func (s *Store) insert(st *stripe, key string, e *entry, state any) {
	if len(st.pending) >= pendingLimit {
		s.offer(st)
		s.cache.Wait()
		for k, pe := range st.pending {
			if _, ok := s.cache.Get(k); !ok {
				pe.gone.Store(false)
				s.cache.Set(k, pe, int64(pe.cost))
			}
		}
		clear(st.pending)
	}
	e.cost = cost(key, state)
	st.pending[key] = e
	if st.held = append(st.held, key); len(st.held) >= offerEvery {
		s.offer(st)
	}
}

// offer hands the stripe's held entries to the cache, in a row.
func (s *Store) offer(st *stripe) {
	for _, k := range st.held {
		if pe := st.pending[k]; pe != nil {
			s.cache.Set(k, pe, int64(pe.cost))
		}
	}
	clear(st.held)
	st.held = st.held[:0]
}

// Sizer is implemented by algorithm states that know their size in bytes.
type Sizer interface {
	Size() int64
}

// cost estimates the bytes a key holds. A key's state is far below 2 GiB
// (a sliding window holds at most 1e6 units).
func cost(key string, state any) int32 {
	n := int64(len(key) + entryOverhead)
	if sz, ok := state.(Sizer); ok {
		n += sz.Size()
	}
	return int32(min(n, math.MaxInt32))
}

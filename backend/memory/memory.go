// Package memory is a core.Store kept in this process: it runs each
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
package memory

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/holdfast/holdfast/core"
)

// DefaultMaxBytes is the memory bound when Options.MaxBytes is zero.
const DefaultMaxBytes = 64 << 20

// entryOverhead estimates what a key costs besides its name and state: the
// entry, ristretto's item and its frequency counters.
const entryOverhead = 200

const stripes = 256

// pendingLimit is how many new keys a stripe remembers before it waits for
// ristretto to apply its buffered inserts.
const pendingLimit = 32

// Options configures a Store. The zero value of each field means its default.
type Options struct {
	// MaxBytes bounds the estimated memory of all keys. 0 means 64 MiB.
	MaxBytes int64
	// Clock is the time source. nil means time.Now.
	Clock func() time.Time
}

// Store is a core.Store in process memory. It is safe for concurrent use.
type Store struct {
	cache *ristretto.Cache[string, *entry]
	clock func() time.Time
	seed  maphash.Seed
	locks [stripes]stripe
}

// stripe serialises the keys that hash to it. Ristretto applies inserts
// asynchronously, so a stripe keeps the entries it inserted until they are
// visible, and a key is never created twice.
type stripe struct {
	mu      sync.Mutex
	pending map[string]*entry
	_       [40]byte
}

type entry struct {
	state   any
	expires int64 // microseconds; the state is void from then on
	cost    int64
}

var _ core.Store = (*Store)(nil)

// New returns a Store.
func New(opts Options) (*Store, error) {
	if opts.MaxBytes < 0 {
		return nil, errors.New("memory: MaxBytes is negative")
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	keys := max(opts.MaxBytes/entryOverhead, 64)
	c, err := ristretto.NewCache(&ristretto.Config[string, *entry]{
		NumCounters:        keys * 10,
		MaxCost:            opts.MaxBytes,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, err
	}
	s := &Store{cache: c, clock: opts.Clock, seed: maphash.MakeSeed()}
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
func (s *Store) Run(ctx context.Context, sc *core.Script, keys []string, args []string) ([]int64, error) {
	f := sc.Local()
	if f == nil {
		return nil, errors.New("memory: script " + sc.Name() + " has no Go twin")
	}
	if len(keys) != 1 {
		return nil, errors.New("memory: script " + sc.Name() + " needs exactly one key")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
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
	now := s.clock().UnixMicro()
	e := s.lookup(st, key)
	var prev any
	if e != nil && now < e.expires {
		prev = e.state
	}
	next, ttl := f(prev, now)
	switch {
	case ttl < 0:
		return
	case next == nil || ttl == 0:
		if e != nil {
			e.state, e.expires = nil, 0
		}
		return
	case e == nil:
		e = &entry{}
		s.insert(st, key, e, next)
	default:
		if c := cost(key, next); c > 2*e.cost {
			e.cost = c
			s.cache.Set(key, e, c)
		}
	}
	e.state, e.expires = next, now+ttl
}

// lookup finds key's entry in the cache or among the stripe's pending ones.
func (s *Store) lookup(st *stripe, key string) *entry {
	if e, ok := s.cache.Get(key); ok {
		return e
	}
	return st.pending[key]
}

// insert adds a new entry. Once the stripe holds pendingLimit unconfirmed
// entries it waits for ristretto to apply them, offers the ones a full
// buffer dropped once more, and forgets the rest: entries the cache's policy
// rejected are forgotten like evicted ones.
func (s *Store) insert(st *stripe, key string, e *entry, state any) {
	if len(st.pending) >= pendingLimit {
		s.cache.Wait()
		for k, pe := range st.pending {
			if _, ok := s.cache.Get(k); !ok {
				s.cache.Set(k, pe, pe.cost)
			}
		}
		clear(st.pending)
	}
	e.cost = cost(key, state)
	s.cache.Set(key, e, e.cost)
	st.pending[key] = e
}

// Sizer is implemented by algorithm states that know their size in bytes.
type Sizer interface {
	Size() int64
}

// cost estimates the bytes a key holds.
func cost(key string, state any) int64 {
	n := int64(len(key) + entryOverhead)
	if sz, ok := state.(Sizer); ok {
		n += sz.Size()
	}
	return n
}

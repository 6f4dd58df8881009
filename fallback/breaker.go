// Package fallback is holdfast's degraded-mode path: the circuit breaker that
// decides when Redis may be used, and the local limiting that takes over when
// it may not.
package fallback

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Errors reported by the breaker. Each is wrapped with detail; test with
// errors.Is.
var (
	// ErrInvalidOptions reports a BreakerOptions value the breaker cannot use.
	ErrInvalidOptions = errors.New("fallback: invalid breaker options")
	// ErrSlowCall is the cause recorded when slow calls opened the breaker.
	ErrSlowCall = errors.New("fallback: slow call")
	// ErrTripped is the cause recorded by Trip when it is given no reason.
	ErrTripped = errors.New("fallback: breaker tripped")
)

// State is where a Breaker stands: only Closed lets callers use Redis.
type State int

const (
	// Closed is the normal state: callers may call Redis.
	Closed State = iota
	// Open means Redis is considered down: callers decide locally while the
	// probe loop checks Redis every ProbeInterval.
	Open
	// Reconciling means a probe succeeded and the outage log is being
	// replayed; callers still decide locally, so nobody sees Redis's stale,
	// pre-outage state.
	Reconciling
)

// String returns "closed", "open" or "reconciling".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case Reconciling:
		return "reconciling"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Defaults for the zero fields of BreakerOptions.
const (
	defaultFailures      = 3
	defaultCallTimeout   = 50 * time.Millisecond
	defaultProbeInterval = time.Second
	defaultJitter        = 100 * time.Millisecond
)

// BreakerOptions configures a Breaker. The zero value of each field means its
// documented default; negative values are rejected by NewBreaker.
type BreakerOptions struct {
	// Failures is how many consecutive failed calls open the breaker.
	// 0 means 3.
	Failures int
	// CallTimeout is the deadline callers should put on each Redis call, and
	// the one each probe gets. 0 means 50ms.
	CallTimeout time.Duration
	// SlowCall is the duration at which a successful call still counts as a
	// failure: a Redis that answers just under the deadline is not healthy.
	// 0 means 4/5 of CallTimeout (40ms with the default CallTimeout). A value
	// at or above CallTimeout turns slow-call detection off in practice.
	SlowCall time.Duration
	// ProbeInterval is how often the probe loop checks Redis while the
	// breaker is Open. 0 means 1s.
	ProbeInterval time.Duration
	// Probe checks Redis's health, for example with a PING. It gets a context
	// with CallTimeout; an error or a call as slow as SlowCall is a failed
	// probe. StartProbing requires it.
	Probe func(ctx context.Context) error
	// Reconcile replays the outage log after a successful probe, in state
	// Reconciling. Its context is the probing context, with no deadline of
	// its own. nil means there is nothing to replay. On error the breaker
	// goes back to Open and the next probe retries.
	Reconcile func(ctx context.Context) error
	// Jitter bounds the random wait between a finished reconcile and the move
	// to Closed, so instances do not all return to Redis at once. The wait is
	// uniform in [0, Jitter). 0 means 100ms; 1ns means no wait.
	Jitter time.Duration
	// Seed seeds the breaker's own random source for Jitter. 0 means a random
	// seed.
	Seed int64
	// Clock tells the time, used to time probes. nil means time.Now.
	Clock func() time.Time
	// After waits like time.After; tests inject it to drive time without
	// sleeping. nil means time.After.
	After func(d time.Duration) <-chan time.Time
	// OnStateChange, if set, is called after every transition. Calls are
	// serial, in the order the transitions happened, and never made while
	// the breaker's lock is held, so the callback may call the breaker (but
	// not Close). The goroutine that made a transition normally makes the
	// call before its method returns; if another goroutine is already
	// delivering, that one delivers it instead.
	OnStateChange func(from, to State)
	// Start is the initial state: Closed (the zero value) or Open, for an
	// instance that starts while Redis is down.
	Start State
}

func (o BreakerOptions) validate() error {
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"CallTimeout", o.CallTimeout}, {"SlowCall", o.SlowCall},
		{"ProbeInterval", o.ProbeInterval}, {"Jitter", o.Jitter},
	}
	for _, f := range durations {
		if f.d < 0 {
			return fmt.Errorf("%w: %s is negative (%v)", ErrInvalidOptions, f.name, f.d)
		}
	}
	if o.Failures < 0 {
		return fmt.Errorf("%w: Failures is negative (%d)", ErrInvalidOptions, o.Failures)
	}
	if o.Start != Closed && o.Start != Open {
		return fmt.Errorf("%w: Start must be closed or open, not %v", ErrInvalidOptions, o.Start)
	}
	return nil
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Failures == 0 {
		o.Failures = defaultFailures
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = defaultCallTimeout
	}
	if o.SlowCall == 0 {
		o.SlowCall = o.CallTimeout * 4 / 5
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = defaultProbeInterval
	}
	if o.Jitter == 0 {
		o.Jitter = defaultJitter
	}
	if o.Seed == 0 {
		o.Seed = rand.Int64()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.After == nil {
		o.After = time.After
	}
	return o
}

// A Breaker decides whether a limiter may call Redis. K consecutive failed or
// slow calls open it; while Open a background probe checks Redis, and a
// successful probe leads through Reconciling back to Closed. Each transition
// starts a new generation, and results reported for an older generation are
// dropped. A Breaker is safe for concurrent use; Allow and a successful Done
// while Closed are lock-free.
type Breaker struct {
	// word packs the generation and the state, gen<<2 | state, so that Allow
	// reads both with one atomic load. It is written only with mu held.
	word atomic.Uint64
	// failures counts consecutive failures in the current generation. It is
	// written only with mu held.
	failures   atomic.Int64
	probes     atomic.Uint64
	reconciles atomic.Uint64

	opt    BreakerOptions
	rng    *rand.Rand    // used only by the probe loop
	opened chan struct{} // capacity 1; signalled on every move to Open

	mu         sync.Mutex
	cause      error
	pending    []stateChange
	delivering bool
	stop       context.CancelFunc
	stopped    chan struct{}
}

type stateChange struct{ from, to State }

// NewBreaker returns a Breaker configured by o, or an error wrapping
// ErrInvalidOptions if a field is negative or Start is not Closed or Open.
func NewBreaker(o BreakerOptions) (*Breaker, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	b := &Breaker{
		opt:    o,
		rng:    rand.New(rand.NewPCG(uint64(o.Seed), uint64(o.Seed))),
		opened: make(chan struct{}, 1),
	}
	b.word.Store(uint64(o.Start))
	if o.Start == Open {
		b.opened <- struct{}{}
	}
	return b, nil
}

func (b *Breaker) load() (gen uint64, s State) {
	w := b.word.Load()
	return w >> 2, State(w & 3)
}

// State returns the current state.
func (b *Breaker) State() State {
	_, s := b.load()
	return s
}

// Generation returns the current generation: the number of transitions since
// the breaker was made.
func (b *Breaker) Generation() uint64 {
	g, _ := b.load()
	return g
}

// CallTimeout returns the deadline callers should put on each Redis call.
func (b *Breaker) CallTimeout() time.Duration { return b.opt.CallTimeout }

// ProbeInterval is how often the probe loop checks Redis while Open.
func (b *Breaker) ProbeInterval() time.Duration { return b.opt.ProbeInterval }

// Cause returns the error that last opened the breaker, or nil if it has not
// opened since it was made.
func (b *Breaker) Cause() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cause
}

// Allow reports whether the caller may call Redis now (the breaker is Closed)
// and the generation to pass to Done with the call's outcome.
func (b *Breaker) Allow() (gen uint64, ok bool) {
	gen, s := b.load()
	return gen, s == Closed
}

// Done reports the outcome of a Redis call that Allow permitted in generation
// gen: its error and how long it took. A call fails if err is non-nil or took
// is at least SlowCall; Failures consecutive failures open the breaker, and a
// success resets the count. Results from another generation, or reported
// while the breaker is not Closed, are dropped.
func (b *Breaker) Done(gen uint64, err error, took time.Duration) {
	if b.word.Load() != gen<<2|uint64(Closed) {
		return
	}
	if err == nil && took < b.opt.SlowCall {
		if b.failures.Load() != 0 {
			b.resetFailures(gen)
		}
		return
	}
	b.fail(gen, err, took)
}

// Refused reports that a Redis call Allow permitted in generation gen was
// answered with a refusal (OOM, READONLY, NOPERM, …): Redis cannot take a
// decision now, however many calls are tried, so the breaker opens at once
// with err as its Cause. Dropped, as Done is, for another generation or a
// breaker that is not Closed.
func (b *Breaker) Refused(gen uint64, err error) {
	b.mu.Lock()
	if b.word.Load() != gen<<2|uint64(Closed) {
		b.mu.Unlock()
		return
	}
	b.setLocked(Open, err)
	b.mu.Unlock()
	b.flush()
}

func (b *Breaker) resetFailures(gen uint64) {
	b.mu.Lock()
	if b.word.Load() == gen<<2|uint64(Closed) {
		b.failures.Store(0)
	}
	b.mu.Unlock()
}

func (b *Breaker) fail(gen uint64, err error, took time.Duration) {
	b.mu.Lock()
	if b.word.Load() != gen<<2|uint64(Closed) {
		b.mu.Unlock()
		return
	}
	if b.failures.Add(1) >= int64(b.opt.Failures) {
		if err == nil {
			err = fmt.Errorf("%w: took %v, threshold %v", ErrSlowCall, took, b.opt.SlowCall)
		}
		b.setLocked(Open, err)
	}
	b.mu.Unlock()
	b.flush()
}

// Trip opens the breaker now, recording reason (ErrTripped if nil) as its
// Cause; use it when a caller sees an unambiguous failure. Tripping an Open
// breaker does nothing. Tripping a Reconciling one abandons the recovery: a
// running Reconcile finishes, but its result is dropped and the next probe
// starts over, so Reconcile must be safe to repeat.
func (b *Breaker) Trip(reason error) {
	if reason == nil {
		reason = ErrTripped
	}
	b.mu.Lock()
	if b.State() == Open {
		b.mu.Unlock()
		return
	}
	b.setLocked(Open, reason)
	b.mu.Unlock()
	b.flush()
}

// Counts is a snapshot of a breaker's counters, for metrics. Its fields are
// read one by one, not as a single atomic snapshot.
type Counts struct {
	// ConsecutiveFailures is the current run of failed calls while Closed.
	ConsecutiveFailures int
	// Transitions is the number of state changes, equal to the generation.
	Transitions uint64
	// Probes is the number of health probes run.
	Probes uint64
	// Reconciles is the number of Reconcile calls that returned nil.
	Reconciles uint64
}

// Counts returns the breaker's counters.
func (b *Breaker) Counts() Counts {
	return Counts{
		ConsecutiveFailures: int(b.failures.Load()),
		Transitions:         b.Generation(),
		Probes:              b.probes.Load(),
		Reconciles:          b.reconciles.Load(),
	}
}

// setLocked moves to state to, starting a new generation, and queues the
// change for OnStateChange. The caller holds mu and calls flush after
// unlocking.
func (b *Breaker) setLocked(to State, cause error) {
	gen, from := b.load()
	b.word.Store((gen+1)<<2 | uint64(to))
	b.failures.Store(0)
	if to == Open {
		b.cause = cause
		select {
		case b.opened <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	if b.opt.OnStateChange != nil {
		b.pending = append(b.pending, stateChange{from, to})
	}
}

// moveIf moves to state to if the generation is still gen, and returns the
// new generation.
func (b *Breaker) moveIf(gen uint64, to State, cause error) (uint64, bool) {
	b.mu.Lock()
	if b.Generation() != gen {
		b.mu.Unlock()
		return 0, false
	}
	b.setLocked(to, cause)
	b.mu.Unlock()
	b.flush()
	return gen + 1, true
}

// flush delivers queued changes to OnStateChange without holding mu. One
// goroutine delivers at a time, which keeps the calls serial and in order.
func (b *Breaker) flush() {
	if b.opt.OnStateChange == nil {
		return
	}
	b.mu.Lock()
	if b.delivering {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	finished := false
	defer func() { // a panicking callback must not wedge delivery
		if !finished {
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	for len(b.pending) > 0 {
		batch := b.pending
		b.pending = nil
		b.mu.Unlock()
		for _, c := range batch {
			b.opt.OnStateChange(c.from, c.to)
		}
		b.mu.Lock()
	}
	b.delivering = false
	finished = true
	b.mu.Unlock()
}

// StartProbing starts the probe loop in one goroutine, which runs until ctx
// is done or Close is called. While the breaker is Open the loop runs Probe
// every ProbeInterval; after a success it moves to Reconciling, runs
// Reconcile, waits a random Jitter and moves to Closed. While Closed it sleeps
// until the breaker opens. StartProbing returns an error if BreakerOptions.Probe is
// nil or probing was already started.
func (b *Breaker) StartProbing(ctx context.Context) error {
	if b.opt.Probe == nil {
		return fmt.Errorf("%w: StartProbing needs a Probe", ErrInvalidOptions)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped != nil {
		return errors.New("fallback: probing already started")
	}
	ctx, b.stop = context.WithCancel(ctx)
	b.stopped = make(chan struct{})
	go b.loop(ctx, b.stopped)
	return nil
}

// Close stops the probe loop, if one was started, and waits for it to exit.
// It must not be called from Probe, Reconcile or OnStateChange.
func (b *Breaker) Close() {
	b.mu.Lock()
	stop, stopped := b.stop, b.stopped
	b.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-stopped
}

func (b *Breaker) loop(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	for {
		if b.State() == Closed {
			select {
			case <-ctx.Done():
				return
			case <-b.opened: // may be stale; the state is checked again
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-b.opt.After(b.opt.ProbeInterval):
		}
		b.probeOnce(ctx)
	}
}

// probeOnce probes an Open breaker and, if Redis is healthy, takes it through
// Reconciling to Closed. Every move is conditional on the generation, so a
// Trip during the recovery wins. A recovery cut short by ctx leaves it Open.
func (b *Breaker) probeOnce(ctx context.Context) {
	gen, s := b.load()
	if s != Open || !b.healthy(ctx) {
		return
	}
	gen, ok := b.moveIf(gen, Reconciling, nil)
	if !ok {
		return
	}
	if err := b.reconcile(ctx); err != nil {
		b.moveIf(gen, Open, err)
		return
	}
	if b.Generation() != gen { // tripped meanwhile: no need to wait
		return
	}
	select {
	case <-ctx.Done():
		b.moveIf(gen, Open, ctx.Err())
	case <-b.opt.After(time.Duration(b.rng.Int64N(int64(b.opt.Jitter)))):
		b.moveIf(gen, Closed, nil)
	}
}

// healthy runs one probe; a slow success counts as a failure.
func (b *Breaker) healthy(ctx context.Context) bool {
	b.probes.Add(1)
	pctx, cancel := context.WithTimeout(ctx, b.opt.CallTimeout)
	defer cancel()
	start := b.opt.Clock()
	err := b.opt.Probe(pctx)
	took := b.opt.Clock().Sub(start)
	return err == nil && took < b.opt.SlowCall && ctx.Err() == nil
}

func (b *Breaker) reconcile(ctx context.Context) error {
	if b.opt.Reconcile == nil {
		return ctx.Err()
	}
	if err := b.opt.Reconcile(ctx); err != nil {
		return fmt.Errorf("fallback: reconcile: %w", err)
	}
	b.reconciles.Add(1)
	return nil
}

package fallback

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/clock"
	"github.com/holdfast/holdfast/reconcile"
)

// OutageMode is what a policy does while Redis is unavailable.
type OutageMode int

const (
	// Leases (the default) limits locally with this instance's share of the
	// quota and folds the usage back into Redis when it returns.
	Leases OutageMode = iota
	// FailClosed denies every request, for routes such as logins where a
	// burst is worse than an outage.
	FailClosed
	// FailOpen admits every request; the usage is still logged and folded
	// back, so the key pays it back afterwards (a debt of at most one
	// bucket or window).
	FailOpen
)

// String returns "leases", "fail_closed" or "fail_open".
func (m OutageMode) String() string {
	switch m {
	case FailClosed:
		return "fail_closed"
	case FailOpen:
		return "fail_open"
	}
	return "leases"
}

// ParseOutageMode parses "leases", "fail_closed" or "fail_open"; "" is
// Leases.
func ParseOutageMode(s string) (OutageMode, error) {
	switch s {
	case "", "leases":
		return Leases, nil
	case "fail_closed":
		return FailClosed, nil
	case "fail_open":
		return FailOpen, nil
	}
	return Leases, fmt.Errorf("fallback: unknown outage mode %q (want leases, fail_closed or fail_open)", s)
}

// Options configures a Limiter. The zero value of each field means its
// documented default.
type Options struct {
	// ID names this instance in the membership set and in batch IDs. ""
	// means hostname-pid, or with a StateDir the ID of the dir's instance
	// slot (see StateDir).
	ID string
	// Prefix starts every storage key. "" means core.DefaultPrefix.
	Prefix string
	// Service names the application whose instances share the quota:
	// the membership set (and so the instance count each divides the
	// quota by) and the recovery barrier are per service, so two
	// services on one Redis and Prefix do not count each other's
	// instances. "" is a service of its own.
	Service string
	// Breaker configures the circuit breaker; its Probe and Reconcile are
	// set by the Limiter. Its CallTimeout (default 50ms) bounds every Redis
	// call on the request path.
	Breaker BreakerOptions
	// ExpectedInstances is the instance count used until membership reports
	// the real one (an instance that starts while Redis is down). 0 means 1.
	ExpectedInstances int
	// Heartbeat is how often the instance refreshes its membership and
	// flushes a leftover outage log. 0 means 1s; a heartbeat counts for three
	// periods.
	Heartbeat time.Duration
	// ShrinkAfter is how long the live instance count must stay lower
	// before this instance takes it (an increase is taken at once). 0 means
	// 10 heartbeat lifetimes (30 × Heartbeat). See setInstances.
	ShrinkAfter time.Duration
	// OutageModes maps policy names to their outage mode; absent means Leases.
	OutageModes map[string]OutageMode
	// MaxLogGrants bounds the outage log's entries: about 250 bytes for a
	// key's first and 40 for each further one (TestKeyFlood). A token bucket
	// key's grants within a millisecond share one entry. 0 means 1<<20. See
	// ErrLogFull for what happens at the bound.
	MaxLogGrants int
	// LeaseBytes bounds the memory of known states and leases, by their
	// estimated size (the heap holds up to about 1.5× that). 0 means 64 MiB;
	// a forgotten key gets a fresh share (policy/N) in an outage.
	LeaseBytes int64
	// StateDir, when set, is where the instance keeps what it knows across
	// a restart, continuously: one append-only journal per Limiter (and per
	// Redis Cluster shard), holdfast-ID.journal, holding the outage log,
	// the live instance count, the clock offset and the known states and
	// leases of up to StateKeys keys. New reads it back: the grants are
	// replayed once Redis answers (batch ids kept: none counts twice), and
	// an instance restarted during an outage divides by the instance count
	// it knew (never less than ExpectedInstances) and continues each key's
	// lease where it stood instead of granting a fresh share. ID must stay
	// the same across restarts (the default, hostname-pid, does not). See
	// docs/state-dir.md.
	//
	// The dir belongs to one live process per ID: New locks it (a second
	// instance with the same ID and dir is an error). Without an ID, New
	// claims the first free instance slot of the dir and takes the ID kept
	// there, so a restarted instance finds its journal again under the same
	// ID whatever its pid or hostname; several instances may share one dir
	// that way.
	StateDir string
	// StateFlush is how often the journal is written and fsynced, all
	// records since the last write at once (group commit); a decision only
	// appends to a buffer in memory. After a SIGKILL at most the grants of
	// the last StateFlush are lost (after a power loss, those and one
	// fsync's); Close writes everything. 0 means 100ms.
	StateFlush time.Duration
	// RestoreKeys bounds the keys whose known state is written back into a
	// Redis that lost its data while it kept answering (restarted without
	// persistence, flushed, failed over to a copy without it): the keys
	// most recently new to this instance, and those in use. A read of the
	// data epoch (a key with no TTL) with each heartbeat and every 100 ms
	// while the breaker is closed finds the loss; the breaker opens
	// (ErrDataLost), and the recovery writes each key's last state from
	// before the loss back before any decision goes through Redis again:
	// into a missing key, or added to what was decided since the loss. So
	// a restart does not hand every client a fresh quota (see
	// docs/operations.md for what is left open). The ring holds each key's
	// storage key and policy. 0 means 100000.
	RestoreKeys int
	// StateKeys bounds the keys whose known state and lease the journal
	// keeps: the most recently used (keys with grants not yet replayed are
	// always kept). A key left out gets a fresh share (policy/N) in an
	// outage after a restart. 0 means 10000.
	StateKeys int
	// Reconcile configures the replay.
	Reconcile reconcile.Options
	// Clock is the local time source. nil means time.Now. It is also the
	// breaker's, unless BreakerOptions.Clock is set.
	Clock func() time.Time
	// After waits like time.After, for every timer of the Limiter: the
	// breaker's probe interval and jitter (unless BreakerOptions.After is
	// set), the recovery barrier, the heartbeat and the retry of a cluster's
	// topology. Tests inject it with Clock to step an outage and its
	// recovery without sleeping. nil means time.After.
	After func(d time.Duration) <-chan time.Time
	// micros is Clock in microseconds since the Unix epoch: the leases'
	// and the outage log's time source.
	micros func() int64
	// NoDenialMemory turns off answering repeats of a Redis denial from
	// memory until its retry time (on by default: a client hammering past
	// its limit then costs no Redis round trip).
	NoDenialMemory bool
	// NewID returns a unique request id for an algorithm that needs one
	// (a sliding window's member). nil means driver.NewRequestID.
	NewID func() string
	// Logger receives breaker transitions and reconciliations. nil means
	// slog.Default().
	Logger *slog.Logger
}

// Limiter is a rate limiter that decides through the shared store while it
// is healthy and with local leases while it is not. It is safe for
// concurrent use. Call Start before use and Close when done.
//
// A Limiter routes each key to a cell: the whole store's, or on Redis
// Cluster, once the topology is known, its shard's. A cell owns a breaker,
// the leases, the outage log, the membership and the recovery barrier.
type Limiter struct {
	// cell is the whole store's: every key until a Cluster's topology is
	// known, and then the keys of slots no shard served.
	*cell
	// shards, once the store's cluster topology is known, routes each key
	// to the cell of its shard (see shards.go).
	shards atomic.Pointer[shardSet]
	user   func(from, to State) // the caller's OnStateChange
	// stateLock holds the state dir's lock for this ID (claimState) until
	// Close; nil without a state dir.
	stateLock *os.File
	notifyMu  sync.Mutex
	notified  State // the state last reported to user
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the topology's retry

	// life is 0 before Start, 1 once started, 2 once closed (3: a test's
	// MarkStarted): a decision outside Start and Close is ErrNotStarted or
	// ErrClosed.
	life atomic.Int32
	// multiMu makes AllowAll's local decisions one at a time.
	multiMu sync.Mutex
}

// cell decides the keys of one scope, the whole store or one Cluster
// shard, through the store while its breaker is closed and with its leases
// while it is not.
type cell struct {
	store   driver.Store
	o       Options
	breaker *Breaker
	leases  *memory.Store
	log     *outageLog
	rec     *reconcile.Reconciler

	// Membership and recovery-barrier keys: "{members}" and "{recovery}",
	// or, for a shard's cell, keys whose hash tag lies in that shard.
	members, barrier string
	// epochKey are the data epoch's, generation's and renewal's keys
	// (epoch.lua), in the membership key's slot; nil on a store in this process, which
	// cannot lose its data while the process lives.
	epochKey []string
	// tag names a shard's cell ("" for the whole store): its keys' hash
	// tag and its journal's name.
	tag string
	// attrs label the cell's log lines (its shard).
	attrs []any
	// changed is told each breaker transition: the Limiter reports it to
	// the caller's OnStateChange (see Limiter.notify).
	changed func(from, to State)
	// retired is set when shard cells decide every key: the whole store's
	// cell then only flushes what its log still holds.
	retired atomic.Bool
	// sharedMode is the Mode of a decision through the store: ModeRedis,
	// or ModeLocal for a store that keeps its state in this process.
	sharedMode core.Mode

	instances atomic.Int64
	// countKnown is set once instances holds a count this instance learned
	// while closed (a heartbeat), kept in its state dir, or was configured
	// (ExpectedInstances above 1): the recovery barrier counts arrivals
	// against it (recovery.lua).
	countKnown atomic.Bool
	countMu    sync.Mutex
	lowSince   int64        // when the live count was first seen below instances (UnixNano), 0 if not
	lowMax     int64        // the highest count seen since lowSince
	offset     atomic.Int64 // store time minus local time, microseconds
	// offsetKnown is set once a reply has told the offset: from then on
	// decision calls carry their deadline in Redis time.
	offsetKnown   atomic.Bool
	lastErr       atomic.Pointer[storeFault]
	unknownLogged atomic.Int64 // when an unrecognised store error was last logged, UnixNano
	// denyUntil is the latest end of any denial the cell has remembered
	// (denial.until, local clock, UnixNano): past it no key holds a live
	// one, and a decision skips the denial memory's lookup (recalled).
	denyUntil  atomic.Int64
	reconciles atomic.Uint64
	lastRecon  atomic.Int64 // duration of the last reconciliation, ns

	flushNow    chan struct{} // signalled when the breaker closes
	closedSince atomic.Int64  // when the breaker last closed (or Start), UnixNano
	confirming  atomic.Bool   // recovering: log replayed, local grants replayed at once
	reconMu     sync.Mutex
	cancel      context.CancelFunc
	wg          sync.WaitGroup

	// jnl is the state dir's journal; nil without StateDir.
	jnl *journal

	// recent are the keys a restore writes back (restore.go); epoch is
	// the data epoch last read (0: none yet) and gen the highest data
	// generation read; restoreDue is set when the epoch changed or the
	// generation went back, until a restore succeeds; renewFrom is the
	// epoch the restore renews first (0: none), after the generation went
	// back.
	recent     recentKeys
	epoch      atomic.Int64
	gen        atomic.Int64
	epochSeen  atomic.Int64 // Redis time of the last read of epoch
	lostSince  atomic.Int64 // Redis time before the last loss: the restore's Since
	leftClosed atomic.Int64 // Redis time (estimate) when the breaker last left Closed
	restoreDue atomic.Bool
	renewFrom  atomic.Int64
	restored   atomic.Uint64 // keys restored, over the cell's life

	// resets are the resets not yet applied in Redis (Reset during an
	// outage).
	resets pendingResets
	// refunds are AllowAll's refunds that the breaker kept from Redis.
	refunds pendingRefunds
}

//go:embed members.lua
var membersSource string

var _ core.Decider = (*Limiter)(nil)

var membersScript = driver.NewScript("members", membersSource, membersLocal)

// membersLocal is the membership script's Go twin, for a store in this
// process (the memory backend): this instance is the only one.
func membersLocal(_ any, now int64, _ []string) (any, []int64, int64, error) {
	return nil, []int64{1, now}, 0, nil
}

//go:embed epoch.lua
var epochSource string

// epochScript reads (and makes, when missing, or renews) the data epoch and
// raises the data generation. It is not run on a store in this process (epochKey).
var epochScript = driver.NewScript("epoch", epochSource, nil)

// leaveScript takes an instance out of the membership set.
var leaveScript = driver.NewScript("members_leave", "return {redis.call('ZREM', KEYS[1], ARGV[1])}",
	func(any, int64, []string) (any, []int64, int64, error) { return nil, []int64{1}, 0, nil })

// leave takes this instance out of the membership set, if Redis is
// reachable (the breaker is closed): the others' share grows at their next
// heartbeat, after ShrinkAfter, instead of after the heartbeat lapses.
func (l *cell) leave() {
	if l.breaker.State() != Closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.breaker.CallTimeout())
	defer cancel()
	if _, err := l.store.Run(ctx, leaveScript, []string{l.members}, []string{l.o.ID}); err != nil {
		l.o.Logger.Info("holdfast: could not leave the membership set", "instance", l.o.ID, "err", err.Error())
	}
}

// New returns a Limiter over store, which should be a Redis backend.
//
// On Redis Cluster (a store implementing driver.Sharded) the Limiter keeps one
// circuit breaker, outage log, membership and recovery per shard, once Start
// has read the topology: a failed master sends only its own keys to local
// leases while the other shards keep deciding through Redis. Until the
// topology is known (Redis unreachable at Start), one breaker covers the
// whole store.
func New(store driver.Store, o Options) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("fallback: nil store")
	}
	var lock *os.File
	if o.StateDir != "" {
		id, f, err := claimState(o.StateDir, o.ID)
		if err != nil {
			return nil, err
		}
		o.ID, lock = id, f
	}
	if err := o.defaults(); err != nil {
		lock.Close()
		return nil, err
	}
	l := &Limiter{stateLock: lock, user: o.Breaker.OnStateChange}
	c, err := newCell(store, o, "", l.wholeChanged)
	if err != nil {
		lock.Close()
		return nil, err
	}
	l.cell = c
	return l, nil
}

// newCell builds the cell of the whole store (tag "") or of one shard,
// whose membership and barrier keys carry the hash tag tag; changed is told
// its breaker's transitions.
func newCell(store driver.Store, o Options, tag string, changed func(from, to State)) (*cell, error) {
	l := &cell{store: store, o: o, tag: tag, changed: changed, flushNow: make(chan struct{}, 1)}
	l.recent.max = o.RestoreKeys
	if o.StateDir != "" {
		l.recent.max = max(l.recent.max, o.StateKeys) // the journal reads it too
	}
	l.members, l.barrier = o.Prefix+"{members}", o.Prefix+"{recovery}"
	if tag != "" {
		l.members, l.barrier = o.Prefix+"{"+tag+"}members", o.Prefix+"{"+tag+"}recovery"
		l.attrs = []any{"shard", tag}
	}
	if o.Service != "" {
		l.members, l.barrier = l.members+":"+o.Service, l.barrier+":"+o.Service
	}
	l.epochKey = []string{l.members + ":epoch", l.members + ":gen", l.members + ":renewed"}

	l.instances.Store(int64(o.ExpectedInstances))
	l.countKnown.Store(o.ExpectedInstances > 1)
	l.sharedMode = core.ModeRedis
	if driver.IsLocal(store) {
		l.sharedMode = core.ModeLocal // a memory store: nothing is shared
		l.epochKey = nil
	}
	leases, err := memory.New(memory.Options{MaxBytes: o.LeaseBytes, Micros: l.storeMicros})
	if err != nil {
		return nil, err
	}
	l.leases = leases
	// Batch ids are the instance, a process nonce of 60 random bits and a
	// sequence number: the replay's markers of one instance's run of
	// sequence numbers share a hash (reconcile), so two processes of one
	// instance must not share a nonce while their markers live.
	l.log = newOutageLog(o.ID+":"+strings.ReplaceAll(uuid.NewString(), "-", "")[:16], o.Prefix, o.MaxLogGrants)
	bo := o.Breaker
	if bo.Clock == nil {
		bo.Clock = o.Clock
	}
	if bo.After == nil {
		bo.After = o.After
	}
	bo.Probe = l.probe
	bo.Reconcile = l.recover
	if bo.Jitter == 0 {
		bo.Jitter = time.Nanosecond // the recovery barrier spreads nothing: instances return together
	}
	bo.OnStateChange = func(from, to State) {
		// Grants are replayed at once only while recovering; the instance
		// count may fall only once the breaker has been closed a while; the
		// grants made while closing are flushed right after.
		if to != Reconciling {
			l.confirming.Store(false)
		}
		if from == Closed {
			l.leftClosed.Store(l.storeMicros())
			if l.jnl != nil {
				l.jnl.outageBegan() // known states: no reply changes them now
			}
		}
		if to == Closed {
			l.closedSince.Store(l.o.Clock().UnixNano())
			select {
			case l.flushNow <- struct{}{}:
			default:
			}
		}
		attrs := []any{"instance", l.o.ID, "from", from.String(), "to", to.String()}
		if cause := l.breaker.Cause(); to == Open && cause != nil {
			// The class and reason first (bounded: docs/errors.md), then the
			// text, which may name keys.
			class, reason := core.ClassOf(cause).String(), core.ReasonOf(cause)
			if errors.Is(cause, ErrSlowCall) {
				class, reason = core.ClassUnavailable.String(), "slow"
			}
			attrs = append(attrs, "class", class, "reason", reason, "cause", cause.Error())
		}
		l.o.Logger.Info("holdfast breaker", append(attrs, l.attrs...)...)
		l.changed(from, to)
	}
	if l.breaker, err = NewBreaker(bo); err != nil {
		return nil, err
	}
	ro := o.Reconcile
	if ro.MergeWindow == 0 {
		// The merge log closes a call deadline before the recovery barrier.
		ro.MergeWindow = 2*l.breaker.ProbeInterval() + l.breaker.CallTimeout()
	}
	l.rec = reconcile.New(ro)
	if o.StateDir != "" {
		if err := l.openJournal(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (o *Options) defaults() error {
	if o.ExpectedInstances < 0 || o.Heartbeat < 0 || o.MaxLogGrants < 0 || o.LeaseBytes < 0 || o.ShrinkAfter < 0 {
		return fmt.Errorf("%w: negative ExpectedInstances, Heartbeat, MaxLogGrants, LeaseBytes or ShrinkAfter", ErrInvalidOptions)
	}
	if o.StateFlush < 0 || o.StateKeys < 0 || o.RestoreKeys < 0 {
		return fmt.Errorf("%w: negative StateFlush, StateKeys or RestoreKeys", ErrInvalidOptions)
	}
	if o.RestoreKeys == 0 {
		o.RestoreKeys = defaultRestoreKeys
	}
	if o.StateFlush == 0 {
		o.StateFlush = defaultStateFlush
	}
	if o.StateKeys == 0 {
		o.StateKeys = defaultStateKeys
	}
	if o.ID == "" {
		host, _ := os.Hostname()
		o.ID = host + "-" + strconv.Itoa(os.Getpid())
	}
	if o.Prefix == "" {
		o.Prefix = core.DefaultPrefix
	}
	o.ExpectedInstances = max(o.ExpectedInstances, 1)
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	if o.ShrinkAfter == 0 {
		o.ShrinkAfter = 30 * o.Heartbeat
	}
	if o.MaxLogGrants == 0 {
		o.MaxLogGrants = 1 << 20
	}
	if o.After == nil {
		o.After = time.After
	}
	if o.Clock == nil {
		o.Clock = time.Now
		o.micros = clock.WallMicros // one clock read per decision, not two
	} else {
		c := o.Clock
		o.micros = func() int64 { return c().UnixMicro() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.NewID == nil {
		o.NewID = driver.NewRequestID
	}
	return nil
}

// setOffset takes the store's clock, storeNow in microseconds, from a
// reply just received. The offset it gives is at most the true one (the
// reply's time was taken before it arrived), so a deadline sent in Redis
// time is never later than the caller's own.
func (l *cell) setOffset(storeNow int64) {
	l.offset.Store(storeNow - l.o.micros())
	if !l.offsetKnown.Load() {
		l.offsetKnown.Store(true)
	}
}

// storeMicros is the local clock converted to the store's clock with the
// tracked offset, in microseconds.
func (l *cell) storeMicros() int64 {
	return l.o.micros() + l.offset.Load()
}

// ErrNotStarted is returned by a decision before Start: without its probe a
// Limiter whose breaker opened would never go back to Redis.
var ErrNotStarted = errors.New("fallback: Limiter used before Start")

// ErrClosed is returned by a decision after Close.
var ErrClosed = errors.New("fallback: Limiter used after Close")

// usable reports ErrNotStarted or ErrClosed, or nil while the Limiter runs.
func (l *Limiter) usable() error {
	switch l.life.Load() {
	case 0:
		return ErrNotStarted
	case 2:
		return ErrClosed
	}
	return nil
}

// Start checks the store and starts the background work: the health probe,
// the membership heartbeat and the flush of leftover logs. If the store is
// unreachable the Limiter starts in degraded mode and serves from leases.
// Decisions before Start return ErrNotStarted; a second Start is an error.
func (l *Limiter) Start(ctx context.Context) error {
	if !l.life.CompareAndSwap(0, 1) && !l.life.CompareAndSwap(3, 1) {
		return errors.New("fallback: Start called twice, or after Close")
	}
	ctx, l.cancel = context.WithCancel(ctx)
	if err := l.cell.start(ctx); err != nil {
		return err
	}
	if sh := driver.ShardedOf(l.store); sh != nil {
		l.startShards(ctx, sh)
	}
	return nil
}

// start starts the cell's background work.
func (l *cell) start(ctx context.Context) error {
	ctx, l.cancel = context.WithCancel(ctx)
	l.closedSince.Store(l.o.Clock().UnixNano())
	lost, err := l.heartbeat(ctx)
	if lost {
		// Redis lost its data since the epoch the state dir kept: the
		// recovery restores the known states read back first.
		l.breaker.Trip(dataLost)
	}
	if err != nil && core.ClassOf(err) != core.ClassRequest {
		l.noteFault(err)
		l.breaker.Trip(err)
		level, msg := slog.LevelWarn, "holdfast: Redis cannot take decisions at start: limiting locally until it can"
		switch core.ReasonOf(err) {
		case "NOAUTH", "WRONGPASS", "NOPERM":
			level, msg = slog.LevelError, "holdfast: Redis refuses this instance's credentials or permissions: limiting locally until it accepts them"
		}
		l.o.Logger.Log(ctx, level, msg, append([]any{"instance", l.o.ID, "reason", core.ReasonOf(err), "err", err.Error()}, l.attrs...)...)
	}
	if err := l.breaker.StartProbing(ctx); err != nil {
		return err
	}
	l.wg.Go(func() { l.background(ctx) })
	if l.jnl != nil {
		l.jnl.start()
	}
	return nil
}

// Close stops the background work and, with a StateDir, writes the journal
// in full.
func (l *Limiter) Close() error {
	if l.life.Swap(2) == 2 {
		return nil // closed already
	}
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	var errs []error
	if set := l.shards.Load(); set != nil {
		for _, c := range set.cells {
			errs = append(errs, c.close())
		}
	}
	errs = append(errs, l.cell.close())
	if l.stateLock != nil {
		l.stateLock.Close() // the state dir is free for the next process
	}
	return errors.Join(errs...)
}

// close stops the cell's background work, leaves the membership set and
// writes the journal in full.
func (l *cell) close() error {
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	l.breaker.Close()
	l.leave()
	defer l.leases.Close()
	return l.jnl.close()
}

// Allow is shorthand for AllowN(ctx, p, key, 1).
func (l *Limiter) Allow(ctx context.Context, p core.Policy, key string) (core.Result, error) {
	return l.AllowN(ctx, p, key, 1)
}

// AllowN decides whether key may spend cost units of policy p now. While
// the breaker is closed Redis decides; otherwise, or when the call fails,
// this instance decides alone with its share of the quota (Result.Degraded).
func (l *Limiter) AllowN(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error) {
	if err := driver.CheckRequest(p, key, cost); err != nil {
		return core.Result{}, err
	}
	if err := l.usable(); err != nil {
		return core.Result{}, err
	}
	var r core.Result
	err := l.cellOf(p, key).decide(ctx, p, key, cost, &r)
	return r, err
}

// decide is AllowN for a checked request, its result in *out (a result
// passed up through three calls by value is copied through memory at
// each; this is every local decision's path). The storage key is built
// only for a call to Redis or a grant to log: a decision from the leases
// or the denial memory on a known key allocates nothing.
func (l *cell) decide(ctx context.Context, p core.Policy, key string, cost int64, out *core.Result) error {
	gen, closed := l.breaker.Allow()
	if closed && !l.o.NoDenialMemory {
		if r, ok := l.recalled(p, key, cost); ok {
			*out = r
			return nil
		}
	}
	var id string
	if p.Algorithm().NeedsID() {
		id = l.o.NewID()
	}
	if closed {
		r, _, err := l.remote(ctx, gen, p, key, cost, id)
		if err == nil || core.ClassOf(err) == core.ClassRequest || ctx.Err() != nil {
			*out = r
			return err
		}
		// The store could not decide: an outage to the breaker, and the
		// request is decided locally by its outage mode. If the call failed
		// after it was sent with no reply, Redis may yet run it; the
		// deadline guard (driver.NewDecisionScript) refuses it then, so only
		// a reply in flight at the deadline can leave it counted twice
		// (under-admission of one request). A sliding window grant keeps
		// the same request id, so there the replay adds it once anyway.
	}
	return l.local(ctx, p, key, cost, id, out)
}

// deadline is the deadline argument (driver.DeadlineArg) of a call sent at
// start with timeout, in Redis time; ok is false until a reply has told
// the clock offset.
func (l *cell) deadline(start time.Time, timeout time.Duration) (string, bool) {
	if !l.offsetKnown.Load() {
		return "", false
	}
	return driver.DeadlineArg(start.UnixMicro() + timeout.Microseconds() + l.offset.Load()), true
}

// remote decides through the store under the breaker's call deadline,
// which the call carries in Redis time once the clock offset is known.
func (l *cell) remote(ctx context.Context, gen uint64, p core.Policy, key string, cost int64, id string) (core.Result, driver.Reply, error) {
	skey := driver.StorageKey(l.o.Prefix, p.Name(), key)
	timeout := l.breaker.CallTimeout()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	start := l.o.Clock()
	args := p.Algorithm().Args(p, cost, id, 0)
	if d, ok := l.deadline(start, timeout); ok {
		args = append(args, d)
	}
	raw, err := l.store.Run(cctx, p.Algorithm().Script(), []string{skey}, args)
	took := l.o.Clock().Sub(start)
	cancel()
	if err == nil {
		var rep driver.Reply
		if rep, err = driver.ParseReply(raw); err == nil {
			l.breaker.Done(gen, nil, took)
			l.observe(skey, p, cost, start, rep)
			return core.ResultOf(p.Limit(), rep, l.sharedMode, false), rep, nil
		}
	}
	if ctx.Err() != nil {
		return core.Result{}, driver.Reply{}, ctx.Err() // the caller gave up: not the store's fault
	}
	if core.ClassOf(err) == core.ClassRequest {
		l.breaker.Done(gen, nil, took) // Redis answered: the request is wrong
		return core.Result{}, driver.Reply{}, err
	}
	l.storeFailed(gen, err, took)
	return core.Result{}, driver.Reply{}, err
}

// storeFailed reports a failed store call made in breaker generation gen:
// the breaker counts it (a refusal opens it at once), and the failure
// becomes the last one Status shows. An error holdfast does not recognise
// is logged with its text, at most once a second.
func (l *cell) storeFailed(gen uint64, err error, took time.Duration) {
	class := core.ClassOf(err)
	now := l.noteFault(err)
	if class == core.ClassUnknown {
		if last := l.unknownLogged.Load(); now.UnixNano()-last >= int64(time.Second) && l.unknownLogged.CompareAndSwap(last, now.UnixNano()) {
			l.o.Logger.Warn("holdfast store error not recognised: decided as an outage", "instance", l.o.ID, "err", err.Error())
		}
	}
	// A refusal opens the breaker at once: Redis said it cannot take a
	// decision. STALE is the one answer that is about this call, not about
	// Redis (it ran late, as a slow call does), so it only counts.
	if se, ok := errors.AsType[*core.StoreError](err); ok && se.Answered && class == core.ClassUnavailable && se.Reason != "STALE" {
		l.breaker.Refused(gen, err)
		return
	}
	l.breaker.Done(gen, err, took)
}

// noteFault makes err the last store failure Status shows, and returns
// when it was noted.
func (l *cell) noteFault(err error) time.Time {
	now := l.o.Clock()
	l.lastErr.Store(&storeFault{class: core.ClassOf(err), reason: core.ReasonOf(err), at: now})
	return now
}

// storeFault is the last store failure: its class, reason and time.
type storeFault struct {
	class  core.ErrorClass
	reason string
	at     time.Time
}

// observe records the Redis reply to a request of cost sent at sent: the
// clock offset, the key's known state and, for a denial, the denial.
func (l *cell) observe(skey string, p core.Policy, cost int64, sent time.Time, rep driver.Reply) {
	l.setOffset(rep.Now)
	var until int64
	l.leases.Update(skey, func(prev any, _ int64) (any, int64) {
		ks, _ := prev.(*keyState)
		if ks == nil {
			ks = &keyState{}
		}
		if l.recent.due(ks.tracked) {
			ks.tracked = l.recent.add(skey, p)
		}
		if !l.restoreDue.Load() { // else Redis lost its data: the known state waits for the restore
			ks.confirm(l.epochSeen.Load(), rep)
			ks.observe(p, cost, rep)
			if ks.peak.at == 0 || rep.Remaining <= ks.peakLeft {
				ks.peak, ks.peakLeft = ks.known, rep.Remaining
			}
		}
		until = ks.remember(p, cost, sent, rep)
		return ks, rep.ResetAfter + int64(time.Second/time.Microsecond)
	})
	// The latest end of any remembered denial (recalled skips the lookup
	// past it): raised, never lowered.
	for cur := l.denyUntil.Load(); until > cur; cur = l.denyUntil.Load() {
		if l.denyUntil.CompareAndSwap(cur, until) {
			break
		}
	}
}

// local decides without the store, by the policy's outage mode, its result
// in *out (see decide).
func (l *cell) local(ctx context.Context, p core.Policy, key string, cost int64, id string, out *core.Result) error {
	switch l.outageMode(p) {
	case FailClosed:
		*out = core.Result{Limit: p.Limit(), RetryAfter: l.breaker.ProbeInterval(), Mode: core.ModeFailClosed, Degraded: true}
		return nil
	case FailOpen:
		g := driver.Grant{ID: id, Cost: cost, At: l.storeMicros()}
		if _, err := l.log.addParts(key, p, driver.Seed{}, g); err != nil {
			*out = core.Result{Limit: p.Limit(), RetryAfter: time.Second, Mode: core.ModeFailOpen, Degraded: true}
			return nil
		}
		l.journalGrant(grantLogged, p, key, driver.Seed{}, id, cost, g.At, 1)
		*out = core.Result{Allowed: true, Limit: p.Limit(), Remaining: p.Limit(), Mode: core.ModeFailOpen, Degraded: true}
		return nil
	}
	n := l.instances.Load()
	// While recovering, a grant is replayed at once (below), not logged.
	confirming := l.confirming.Load() && l.breaker.State() == Reconciling
	var rep driver.Reply
	var seed driver.Seed
	var logged bool
	var logErr error
	l.leases.UpdateParts(l.o.Prefix, p.Name(), key, func(prev any, now int64) (any, int64) {
		ks, _ := prev.(*keyState)
		if ks == nil {
			ks = &keyState{}
		}
		ks.decideLease(p, n, now, cost, &rep) // an algorithm without a lease denies
		seed = ks.seed
		if rep.Allowed && !confirming {
			// Logged under the key's lock: a coalescing grant joins the
			// key's live log entry without the log's lock when it can.
			logged = true
			if ks.live == nil || !ks.live.add(cost, rep.Now) {
				ks.live, logErr = l.log.addParts(key, p, seed, driver.Grant{ID: id, Cost: cost, At: rep.Now})
			}
			if logErr == nil {
				l.journalGrant(grantLogged|grantLeased, p, key, seed, id, cost, rep.Now, n)
			}
		}
		return ks, rep.ResetAfter + int64(time.Second/time.Microsecond)
	})
	*out = core.ResultOf(share(p.Limit(), n), rep, core.ModeLocal, true)
	if out.Allowed && !logged { // confirming: not logged above
		// Redis is back and this instance's log is replayed: the grant is
		// replayed at once, in the recovery's merge log, instead of waiting
		// in the outage log until after the switch back to Redis.
		// Bounded by the call deadline like any decision through Redis; if
		// it fails the grant goes to the outage log (at worst counted twice).
		b := driver.Batch{ID: l.log.nextID(), Key: driver.StorageKey(l.o.Prefix, p.Name(), key), Policy: p, Seed: seed, Grants: []driver.Grant{{ID: id, Cost: cost, At: rep.Now}}}
		cctx, cancel := context.WithTimeout(ctx, l.breaker.CallTimeout())
		errs := l.rec.Reconcile(cctx, l.store, []driver.Batch{b})
		cancel()
		l.noteReplayed([]driver.Batch{b}, errs)
		if errs[0] == nil {
			l.journalGrant(grantLeased, p, key, seed, id, cost, rep.Now, n)
			return nil
		}
		if _, logErr = l.log.addParts(key, p, seed, b.Grants[0]); logErr == nil {
			l.journalGrant(grantLogged|grantLeased, p, key, seed, id, cost, rep.Now, n)
		}
	}
	if logErr != nil {
		// Denied: a grant that cannot be logged would be lost usage.
		out.Allowed, out.RetryAfter = false, time.Second
	}
	return nil
}

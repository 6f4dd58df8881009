package harness

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	xrate "golang.org/x/time/rate"

	gl "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/backend/memory"
	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

// An outcome is what one decision reported.
type outcome uint8

const (
	allowed  outcome = 1 << iota // the request was admitted
	degraded                     // decided without Redis
)

// decideFunc makes one decision for key.
type decideFunc func(ctx context.Context, key string) (outcome, error)

// A limiterImpl is one limiter under test: open builds it on the Redis at
// url (ignored by in-process limiters) and returns its decision function and
// a close function.
type limiterImpl struct {
	name string
	open func(ctx context.Context, url string) (decideFunc, func(), error)
	// ready, when set, waits until the limiter decides through Redis again
	// (a fallback.Limiter whose breaker an earlier run tripped).
	ready func(ctx context.Context) error
}

// Limits used by the throughput cells: high enough that every decision is
// an admission, so every limiter does its full write path.
const (
	hiLimit  = 1_000_000 // tokens (or units per window)
	hiPerSec = 1_000_000 // refill per second
)

var discard = func() *slog.Logger {
	if os.Getenv("HOLDFAST_BENCH_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}()

func hfResult(r core.Result, err error) (outcome, error) {
	var o outcome
	if r.Allowed {
		o |= allowed
	}
	if r.Degraded {
		o |= degraded
	}
	return o, err
}

// coreOn decides with a plain core.Limiter over the store that mk builds.
func coreOn(p func() (core.Policy, error), mk func(url string) (driver.Store, func(), error)) func(context.Context, string) (decideFunc, func(), error) {
	return func(_ context.Context, url string) (decideFunc, func(), error) {
		pol, err := p()
		if err != nil {
			return nil, nil, err
		}
		store, closeStore, err := mk(url)
		if err != nil {
			return nil, nil, err
		}
		l, err := core.NewLimiter(store, core.Options{})
		if err != nil {
			closeStore()
			return nil, nil, err
		}
		return func(ctx context.Context, key string) (outcome, error) {
			return hfResult(l.Allow(ctx, pol, key))
		}, closeStore, nil
	}
}

// fallbackImpl is a limiter on the whole outage-proof stack,
// fallback.Limiter, over the store that mk builds. Before each run it waits
// for the breaker to be closed.
func fallbackImpl(name string, p func() (core.Policy, error), mk func(url string) (driver.Store, func(), error), o fallback.Options) limiterImpl {
	var l *fallback.Limiter
	return limiterImpl{
		name: name,
		open: fallbackOn(p, mk, o, &l),
		ready: func(ctx context.Context) error {
			if l == nil {
				return nil
			}
			return waitClosed(ctx, l, 20*time.Second)
		},
	}
}

// fallbackOn opens a fallback.Limiter and stores it in *out.
func fallbackOn(p func() (core.Policy, error), mk func(url string) (driver.Store, func(), error), o fallback.Options, out **fallback.Limiter) func(context.Context, string) (decideFunc, func(), error) {
	return func(ctx context.Context, url string) (decideFunc, func(), error) {
		pol, err := p()
		if err != nil {
			return nil, nil, err
		}
		store, closeStore, err := mk(url)
		if err != nil {
			return nil, nil, err
		}
		o.Logger = discard
		if o.ID == "" {
			o.ID = "bench"
		}
		l, err := fallback.New(store, o)
		if err != nil {
			closeStore()
			return nil, nil, err
		}
		if err := l.Start(ctx); err != nil {
			closeStore()
			return nil, nil, err
		}
		*out = l
		return func(ctx context.Context, key string) (outcome, error) {
				return hfResult(l.Allow(ctx, pol, key))
			}, func() {
				_ = l.Close()
				closeStore()
			}, nil
	}
}

func rueidisStore(url string) (driver.Store, func(), error) {
	c, err := hfrueidis.NewClient(url, hfrueidis.ClientOptions{})
	if err != nil {
		return nil, nil, err
	}
	return hfrueidis.New(c), c.Close, nil
}

func goredisStore(url string) (driver.Store, func(), error) {
	c, err := goredis.NewClient(url, goredis.ClientOptions{})
	if err != nil {
		return nil, nil, err
	}
	return goredis.New(c), func() { _ = c.Close() }, nil
}

func hiTB() (core.Policy, error) { return tokenbucket.Policy("tb", hiLimit, hiPerSec) }
func hiSW() (core.Policy, error) { return slidingwindow.Policy("sw", hiLimit, time.Second) }
func hiSC() (core.Policy, error) { return slidingcounter.Policy("sc", hiLimit, time.Second) }

// peerClient is a go-redis client as a peer's user would build it: the
// library defaults (pool of 10 per GOMAXPROCS, like holdfast's client).
func peerClient(url string) (*redis.Client, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(o), nil
}

func redisRate(limit redis_rate.Limit) func(context.Context, string) (decideFunc, func(), error) {
	return func(_ context.Context, url string) (decideFunc, func(), error) {
		c, err := peerClient(url)
		if err != nil {
			return nil, nil, err
		}
		l := redis_rate.NewLimiter(c)
		return func(ctx context.Context, key string) (outcome, error) {
			r, err := l.Allow(ctx, key, limit)
			if err != nil || r.Allowed == 0 {
				return 0, err
			}
			return allowed, nil
		}, func() { _ = c.Close() }, nil
	}
}

func ulule(ctx context.Context, url string) (decideFunc, func(), error) {
	c, err := peerClient(url)
	if err != nil {
		return nil, nil, err
	}
	store, err := ulredis.NewStoreWithOptions(c, limiter.StoreOptions{Prefix: "limiter"})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	l := limiter.New(store, limiter.Rate{Period: time.Second, Limit: hiLimit})
	return func(ctx context.Context, key string) (outcome, error) {
		r, err := l.Get(ctx, key)
		if err != nil || r.Reached {
			return 0, err
		}
		return allowed, nil
	}, func() { _ = c.Close() }, nil
}

// Names of the Redis-backed limiters, used by the report.
const (
	implHFRueidisTB   = "holdfast rueidis tb"
	implHFRueidisSW   = "holdfast rueidis sw"
	implHFGoredisTB   = "holdfast go-redis tb"
	implHFGoredisSW   = "holdfast go-redis sw"
	implHFRueidisSC   = "holdfast rueidis sc"
	implHFGoredisSC   = "holdfast go-redis sc"
	implHFFallbackTB  = "holdfast fallback rueidis tb"
	implRedisRate     = "redis_rate"
	implUlule         = "ulule"
	implDenyMemory    = "holdfast fallback rueidis, denial memory"
	implDenyNoMemory  = "holdfast fallback rueidis, NoDenialMemory"
	implDenyRedisRate = "redis_rate (denied key)"
)

// throughputImpls are section 1's limiters, all admitting every request.
func throughputImpls() []limiterImpl {
	return []limiterImpl{
		{name: implHFRueidisTB, open: coreOn(hiTB, rueidisStore)},
		{name: implHFRueidisSW, open: coreOn(hiSW, rueidisStore)},
		{name: implHFGoredisTB, open: coreOn(hiTB, goredisStore)},
		{name: implHFGoredisSW, open: coreOn(hiSW, goredisStore)},
		{name: implHFRueidisSC, open: coreOn(hiSC, rueidisStore)},
		{name: implHFGoredisSC, open: coreOn(hiSC, goredisStore)},
		fallbackImpl(implHFFallbackTB, hiTB, rueidisStore, fallback.Options{}),
		{name: implRedisRate, open: redisRate(redis_rate.Limit{Rate: hiPerSec, Burst: hiLimit, Period: time.Second})},
		{name: implUlule, open: ulule},
	}
}

// denyTB is a policy a hammering client is far past: one token per 10 s.
func denyTB() (core.Policy, error) { return tokenbucket.Policy("deny", 1, 0.1) }

// denialImpls hammer one key far past its limit.
func denialImpls() []limiterImpl {
	return []limiterImpl{
		fallbackImpl(implDenyMemory, denyTB, rueidisStore, fallback.Options{}),
		fallbackImpl(implDenyNoMemory, denyTB, rueidisStore, fallback.Options{NoDenialMemory: true}),
		{name: implDenyRedisRate, open: redisRate(redis_rate.Limit{Rate: 1, Burst: 1, Period: 10 * time.Second})},
	}
}

// Local limiters (section 2). Each admits every request in the measured
// loop: capacity 1e9 at 1e6 tokens per second.
const (
	localCap    = 1_000_000_000
	localPerSec = 1_000_000
)

// downStore is a Redis that is down; the degraded limiter never calls it.
type downStore struct{}

func (downStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return nil, core.ErrStoreUnavailable
}

const (
	implLocalMemory   = "holdfast memory backend (core.Limiter)"
	implLocalDegraded = "holdfast degraded (fallback, breaker open)"
	implLocalXRate    = "x/time/rate (sync.Map of limiters)"
	implLocalGoLim    = "go-limiter memorystore"
)

func localImpls() []limiterImpl {
	localTB := func() (core.Policy, error) { return tokenbucket.Policy("local", localCap, localPerSec) }
	return []limiterImpl{
		{name: implLocalMemory, open: coreOn(localTB, func(string) (driver.Store, func(), error) {
			s, err := memory.New(memory.Options{})
			if err != nil {
				return nil, nil, err
			}
			return s, s.Close, nil
		})},
		{name: implLocalDegraded, open: func(context.Context, string) (decideFunc, func(), error) {
			pol, err := localTB()
			if err != nil {
				return nil, nil, err
			}
			// The store is always down and the probe comes once an hour,
			// so the breaker stays open.
			l, err := fallback.New(downStore{}, fallback.Options{ID: "bench", Logger: discard,
				Breaker: fallback.BreakerOptions{Start: fallback.Open, ProbeInterval: time.Hour}})
			if err == nil {
				err = l.Start(context.Background())
			}
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context, key string) (outcome, error) {
				return hfResult(l.Allow(ctx, pol, key))
			}, func() { _ = l.Close() }, nil
		}},
		{name: implLocalXRate, open: func(context.Context, string) (decideFunc, func(), error) {
			var m sync.Map // string -> *rate.Limiter
			return func(_ context.Context, key string) (outcome, error) {
				v, ok := m.Load(key)
				if !ok {
					v, _ = m.LoadOrStore(key, xrate.NewLimiter(localPerSec, localCap))
				}
				if v.(*xrate.Limiter).Allow() {
					return allowed, nil
				}
				return 0, nil
			}, func() {}, nil
		}},
		{name: implLocalGoLim, open: func(context.Context, string) (decideFunc, func(), error) {
			s, err := memorystore.New(&memorystore.Config{Tokens: localCap, Interval: time.Second})
			if err != nil {
				return nil, nil, err
			}
			var _ gl.Store = s
			return func(ctx context.Context, key string) (outcome, error) {
				_, _, _, ok, err := s.Take(ctx, key)
				if ok {
					return allowed, err
				}
				return 0, err
			}, func() { _ = s.Close(context.Background()) }, nil
		}},
	}
}

// selectImpls keeps the limiters whose names contain one of filters (all
// when filters is empty).
func selectImpls(all []limiterImpl, filters []string) []limiterImpl {
	if len(filters) == 0 {
		return all
	}
	var out []limiterImpl
	for _, im := range all {
		for _, f := range filters {
			if containsFold(im.name, f) {
				out = append(out, im)
				break
			}
		}
	}
	return out
}

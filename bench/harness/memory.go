package harness

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/bench/redisproc"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// memoryRow is one storage layout's cost.
type memoryRow struct {
	Name       string
	KeyExample string
	// UsagePerKey is MEMORY USAGE (SAMPLES 0) over a sample of keys.
	UsagePerKey []float64
	// DeltaPerKey is the used_memory growth divided by the keys (or the
	// requests, for the per-request rows), once per repetition.
	DeltaPerKey []float64
}

type memoryResult struct {
	Keys   int
	Sample int
	Rows   []*memoryRow
}

const (
	memTB       = "holdfast token bucket, after 1 decision"
	memSW       = "holdfast sliding window, after 1 decision"
	memSC       = "holdfast sliding window counter, after 1 decision"
	memSWSmall  = "holdfast sliding window, per further request (≤128 in window: listpack)"
	memSWLarge  = "holdfast sliding window, per further request (1k–10k in window: skiplist)"
	memRedisRat = "redis_rate (GCRA), after 1 decision"
	memUlule    = "ulule (fixed window), after 1 decision"
)

const fanOutAttempts = 3

// memSample is how many keys MEMORY USAGE reads.
const memSample = 100

// memory runs section 5 on a fresh redis-server: N keys, one decision each,
// for each layout; the used_memory delta and MEMORY USAGE of a sample.
func (h *harness) memory(ctx context.Context) error {
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer admin.Close()
	n := h.cfg.MemoryKeys
	res := &memoryResult{Keys: n, Sample: memSample}
	h.report.Memory = res
	tb, err := tokenbucket.Policy("tb", 100, 0.01) // a key lives 100 s after one decision
	if err != nil {
		return err
	}
	sw, err := slidingwindow.Policy("sw", 1_000_000, 10*time.Minute)
	if err != nil {
		return err
	}
	// Two counts a key whatever the traffic: "k:c:p", 12 characters here.
	sc, err := slidingcounter.Policy("sc", 100, 100*time.Second)
	if err != nil {
		return err
	}
	store, closeStore, err := rueidisStore(srv.URL())
	if err != nil {
		return err
	}
	defer closeStore()
	hf, err := core.NewLimiter(store, core.Options{})
	if err != nil {
		return err
	}
	peer, err := peerClient(srv.URL())
	if err != nil {
		return err
	}
	defer peer.Close()
	rr := redis_rate.NewLimiter(peer)
	ulStore, err := ulredis.NewStoreWithOptions(peer, limiter.StoreOptions{Prefix: "limiter"})
	if err != nil {
		return err
	}
	ul := limiter.New(ulStore, limiter.Rate{Period: 100 * time.Second, Limit: 100})
	keys := makeKeys(n)
	hfKey := func(p core.Policy) func(string) string {
		return func(k string) string { return driver.StorageKey(core.DefaultPrefix, p.Name(), k) }
	}
	layouts := []struct {
		row    *memoryRow
		decide func(ctx context.Context, k string) error
		key    func(string) string
	}{
		{&memoryRow{Name: memTB}, func(ctx context.Context, k string) error { _, err := hf.Allow(ctx, tb, k); return err }, hfKey(tb)},
		{&memoryRow{Name: memSW}, func(ctx context.Context, k string) error { _, err := hf.Allow(ctx, sw, k); return err }, hfKey(sw)},
		{&memoryRow{Name: memSC}, func(ctx context.Context, k string) error { _, err := hf.Allow(ctx, sc, k); return err }, hfKey(sc)},
		{&memoryRow{Name: memRedisRat}, func(ctx context.Context, k string) error {
			_, err := rr.Allow(ctx, k, redis_rate.Limit{Rate: 1, Burst: 100, Period: 100 * time.Second})
			return err
		}, func(k string) string { return "rate:" + k }},
		{&memoryRow{Name: memUlule}, func(ctx context.Context, k string) error { _, err := ul.Get(ctx, k); return err },
			func(k string) string { return "limiter:" + k }},
	}
	small := &memoryRow{Name: memSWSmall, KeyExample: hfKey(sw)("k000000")}
	large := &memoryRow{Name: memSWLarge, KeyExample: hfKey(sw)("big")}
	for rep := range h.cfg.Reps {
		for _, lay := range layouts {
			lay.row.KeyExample = lay.key(keys[0])
			if err := admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			u0, err := usedMemory(ctx, admin)
			if err != nil {
				return err
			}
			if err := fanOut(ctx, keys, 1, lay.decide); err != nil {
				return fmt.Errorf("%s: %w", lay.row.Name, err)
			}
			u1, err := usedMemory(ctx, admin)
			if err != nil {
				return err
			}
			lay.row.DeltaPerKey = append(lay.row.DeltaPerKey, (u1-u0)/float64(n))
			if rep == 0 {
				if lay.row.UsagePerKey, err = sampleUsage(ctx, admin, keys, lay.key); err != nil {
					return err
				}
			}
			h.progress("memory %-50s rep %d: %.1f B/key used_memory delta", lay.row.Name, rep+1, (u1-u0)/float64(n))
			if lay.row.Name == memSW {
				if err := h.swPerRequest(ctx, admin, hf, sw, keys, small, large, rep); err != nil {
					return err
				}
			}
		}
	}
	res.Rows = []*memoryRow{layouts[0].row, layouts[1].row, small, large, layouts[2].row, layouts[3].row, layouts[4].row}
	return nil
}

// swPerRequest measures what each further request in a window costs: ten
// more on each of the first 1000 keys (small sorted sets), and 9000 more on
// one key that already holds 1000.
func (h *harness) swPerRequest(ctx context.Context, admin *redis.Client, hf *core.Limiter, sw core.Policy, keys []string, small, large *memoryRow, rep int) error {
	sk := keys[:min(1000, len(keys))]
	key := func(k string) string { return driver.StorageKey(core.DefaultPrefix, sw.Name(), k) }
	// MEMORY USAGE is one figure (the first repetition's); the used_memory
	// deltas are taken every repetition, outside those calls.
	var before, after []float64
	var err error
	if rep == 0 {
		if before, err = sampleUsage(ctx, admin, sk, key); err != nil {
			return err
		}
	}
	u0, err := usedMemory(ctx, admin)
	if err != nil {
		return err
	}
	const more = 10
	decide := func(ctx context.Context, k string) error { _, err := hf.Allow(ctx, sw, k); return err }
	if err := fanOut(ctx, sk, more, decide); err != nil {
		return err
	}
	u1, err := usedMemory(ctx, admin)
	if err != nil {
		return err
	}
	small.DeltaPerKey = append(small.DeltaPerKey, (u1-u0)/float64(more*len(sk)))
	if rep == 0 {
		if after, err = sampleUsage(ctx, admin, sk, key); err != nil {
			return err
		}
		for i := range after {
			small.UsagePerKey = append(small.UsagePerKey, (after[i]-before[i])/more)
		}
	}
	big := []string{"big"}
	if err := fanOut(ctx, slices.Repeat(big, 1000), 1, decide); err != nil {
		return err
	}
	var a, b int64
	if rep == 0 {
		if a, err = admin.MemoryUsage(ctx, key("big"), 0).Result(); err != nil {
			return err
		}
	}
	u2, err := usedMemory(ctx, admin)
	if err != nil {
		return err
	}
	if err := fanOut(ctx, slices.Repeat(big, 9000), 1, decide); err != nil {
		return err
	}
	u3, err := usedMemory(ctx, admin)
	if err != nil {
		return err
	}
	large.DeltaPerKey = append(large.DeltaPerKey, (u3-u2)/9000)
	if rep == 0 {
		if b, err = admin.MemoryUsage(ctx, key("big"), 0).Result(); err != nil {
			return err
		}
		large.UsagePerKey = []float64{float64(b-a) / 9000}
	}
	return admin.Del(ctx, key("big")).Err()
}

// fanOut calls decide times times on each key, from 64 goroutines. A
// failed call (a deadline on a busy machine) is tried again, up to
// fanOutAttempts times in all: the memory figures need every key written,
// and a second write of a key that was written changes its size little.
func fanOut(ctx context.Context, keys []string, times int, decide func(context.Context, string) error) error {
	const g = 64
	var wg sync.WaitGroup
	errs := make([]error, g)
	for w := range g {
		wg.Go(func() {
			for i := w; i < len(keys); i += g {
				for range times {
					var err error
					for range fanOutAttempts {
						if err = decide(ctx, keys[i]); err == nil {
							break
						}
					}
					if err != nil && errs[w] == nil {
						errs[w] = err
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func usedMemory(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	return parseFloat(infoFields(info)["used_memory"]), nil
}

// sampleUsage is MEMORY USAGE (all nested values counted) of up to
// memSample keys spread over keys, or of each key when keys is that short.
func sampleUsage(ctx context.Context, c *redis.Client, keys []string, name func(string) string) ([]float64, error) {
	step := max(len(keys)/memSample, 1)
	if len(keys) <= 1000 {
		step = 1
	}
	var out []float64
	for i := 0; i < len(keys); i += step {
		v, err := c.MemoryUsage(ctx, name(keys[i]), 0).Result()
		if err != nil {
			return nil, fmt.Errorf("MEMORY USAGE %s: %w", name(keys[i]), err)
		}
		out = append(out, float64(v))
	}
	return out, nil
}

package harness

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/reconcile"
)

type reconcileCell struct {
	Backend string
	Alg     string
	Keys    int
}

type reconcileResult struct {
	Backends []string
	Algs     []string
	Sizes    []int
	Grants   int // per key
	Runs     map[reconcileCell][]time.Duration
	// Failed counts batches that failed their first attempt (all runs);
	// they were sent again, and the time includes that.
	Failed map[reconcileCell]int
	// RedisUsPerKey is Redis's CPU time (INFO cpu) per key replayed, one
	// figure per run.
	RedisUsPerKey map[reconcileCell][]float64
	// Expired is how many keys Redis expired during the replay (INFO
	// stats expired_keys), one figure per run: keys replayed early whose
	// TTL ended before the replay did, deleted by Redis on the same core.
	Expired map[reconcileCell][]int64
	// Extra are the rows besides the algorithms', run at sizes up to 100k
	// keys: the floor rows (floorBodies), the token bucket's replay calls
	// with another body; and the rows of extraRows.
	Extra []string
}

// The floor rows replay the token bucket's batches, with its arguments,
// markers and calls, through a body that does nothing but reply
// (floorNoop) or only SETs its key (floorSet): the Redis CPU a key costs
// before the algorithm's own work, and with the one write a token bucket
// replay makes.
const (
	floorNoop = "floor: body replies only"
	floorSet  = "floor: body SETs its key only"
)

// The rows of a replay another way (extraRows).
const (
	scriptsTB = "token_bucket: replay scripts only"
	scriptsSW = "sliding_window: replay scripts only"
	presentTB = "token_bucket: its keys in Redis"
)

// extraRows are the rows of a replay another way: of the algorithm's
// batches, by a Reconciler of the options, into a Redis holding every
// key first when present (a bucket as a decision leaves it, as after a
// partition: Redis kept its keys).
var extraRows = map[string]struct {
	alg     string
	o       reconcile.Options
	present bool
}{
	scriptsTB: {alg: tokenbucket.Name, o: reconcile.Options{FreshMin: -1}},
	scriptsSW: {alg: slidingwindow.Name, o: reconcile.Options{FreshMin: -1}},
	presentTB: {alg: tokenbucket.Name, present: true},
}

// floorBodies are the floor rows' replay bodies (driver.NewReplayScript).
var floorBodies = map[string]string{
	floorNoop: "return {1, 0, now}",
	floorSet:  "redis.call('SET', key, '0', 'PX', '60000')\nreturn {1, 0, now}",
}

// floorAlg is the token bucket with the replay script of a floor row.
type floorAlg struct {
	driver.Replayer
	name   string
	script *driver.Script
}

func (a floorAlg) Name() string                 { return a.name }
func (a floorAlg) ReplayScript() *driver.Script { return a.script }

// floorPolicy is tb's policy on the floor row named row.
func floorPolicy(tb core.Policy, row string) (core.Policy, error) {
	rp, ok := tb.Algorithm().(driver.Replayer)
	if !ok {
		return core.Policy{}, fmt.Errorf("floor row %q: %s has no replay", row, tb.Algorithm().Name())
	}
	alg := floorAlg{Replayer: rp, name: row, script: driver.NewReplayScript("reconcile_floor", floorBodies[row])}
	return driver.NewPolicy("rfl", alg, tb.Limit(), tb.Interval())
}

// grantsPerKey is how many grants each key's batch carries.
const grantsPerKey = 3

// reconcile runs section 4: outage logs of n keys (one batch of three
// grants per key), replayed with reconcile.Reconciler through each
// backend's store (pipelined). Only the Reconcile call is timed.
func (h *harness) reconcile(ctx context.Context) error {
	res := &reconcileResult{
		Backends: []string{"rueidis", "go-redis"}, Algs: []string{tokenbucket.Name, slidingwindow.Name, slidingcounter.Name},
		Sizes: h.cfg.ReconcileSizes, Grants: grantsPerKey, Runs: map[reconcileCell][]time.Duration{}, Failed: map[reconcileCell]int{},
		RedisUsPerKey: map[reconcileCell][]float64{}, Expired: map[reconcileCell][]int64{}, Extra: []string{scriptsTB, scriptsSW, presentTB, floorNoop, floorSet},
	}
	h.report.Reconcile = res
	stores := map[string]driver.Store{}
	for _, b := range res.Backends {
		mk := rueidisStore
		if b == "go-redis" {
			mk = goredisStore
		}
		s, closeStore, err := mk(h.srv.URL())
		if err != nil {
			return err
		}
		defer closeStore()
		stores[b] = s
	}
	tb, err := tokenbucket.Policy("rtb", 100, cmp.Or(h.cfg.ReconcileTBRate, 10))
	if err != nil {
		return err
	}
	sw, err := slidingwindow.Policy("rsw", 100, time.Minute)
	if err != nil {
		return err
	}
	sc, err := slidingcounter.Policy("rsc", 100, time.Minute)
	if err != nil {
		return err
	}
	pols := map[string]core.Policy{tokenbucket.Name: tb, slidingwindow.Name: sw, slidingcounter.Name: sc}
	recs := map[string]*reconcile.Reconciler{}
	for _, row := range res.Extra {
		if x, ok := extraRows[row]; ok {
			pols[row], recs[row] = pols[x.alg], reconcile.New(x.o)
		} else if pols[row], err = floorPolicy(tb, row); err != nil {
			return err
		}
	}
	algs := append(slices.Clone(res.Algs), res.Extra...)
	r := reconcile.New(reconcile.Options{})
	// One warm-up replay per backend loads the scripts and opens connections.
	for _, b := range res.Backends {
		for _, alg := range algs {
			if err := replay(ctx, r, stores[b], pols[alg], "warm-"+b, 100); err != nil {
				return err
			}
		}
	}
	for _, alg := range algs {
		for _, n := range res.Sizes {
			if slices.Contains(res.Extra, alg) && n > 100_000 {
				continue
			}
			rec := r
			if recs[alg] != nil {
				rec = recs[alg]
			}
			reps := h.cfg.Reps
			if n > 100_000 {
				reps = h.cfg.ReconcileBigReps
			}
			for rep := range reps {
				for _, b := range res.Backends {
					// Every run replays into an empty Redis, as after a
					// restart: without the flush a backend would replay onto
					// the keys the previous run left, its merge logs still
					// open for the last second of them.
					if err := h.admin.FlushAll(ctx).Err(); err != nil {
						return err
					}
					if extraRows[alg].present {
						if err := fillBuckets(ctx, h, pols[alg], n); err != nil {
							return err
						}
					}
					id := fmt.Sprintf("%s-%d-", b, rep)
					cpu0, err := redisCPU(ctx, h.admin)
					if err != nil {
						return err
					}
					exp0, err := redisExpired(ctx, h.admin)
					if err != nil {
						return err
					}
					t0 := time.Now()
					var failed int
					err = replayTimed(ctx, rec, stores[b], pols[alg], id, n, &t0, &failed)
					took := time.Since(t0)
					if err != nil {
						return fmt.Errorf("%s %s %d keys: %w", b, alg, n, err)
					}
					cpu1, err := redisCPU(ctx, h.admin)
					if err != nil {
						return err
					}
					exp1, err := redisExpired(ctx, h.admin)
					if err != nil {
						return err
					}
					c := reconcileCell{Backend: b, Alg: alg, Keys: n}
					res.Runs[c] = append(res.Runs[c], took)
					res.Failed[c] += failed
					res.RedisUsPerKey[c] = append(res.RedisUsPerKey[c], (cpu1-cpu0)*1e6/float64(n))
					res.Expired[c] = append(res.Expired[c], exp1-exp0)
					h.progress("reconcile %-8s %-14s %6d keys rep %d: %v (%d batches failed first time, %.1f µs Redis CPU a key, %d keys expired meanwhile)",
						b, alg, n, rep+1, took.Round(time.Microsecond), failed, (cpu1-cpu0)*1e6/float64(n), exp1-exp0)
				}
			}
		}
	}
	return h.admin.FlushAll(ctx).Err()
}

// fillBuckets writes the n keys of replayTimed for token bucket p as
// decisions leave them: a bucket with half its tokens, no merge log.
func fillBuckets(ctx context.Context, h *harness, p core.Policy, n int) error {
	e := strconv.FormatInt(time.Now().UnixMicro()-p.Limit()*p.Interval().Microseconds()/2, 10)
	for lo := 0; lo < n; lo += 1000 {
		pipe := h.admin.Pipeline()
		for k := lo; k < min(lo+1000, n); k++ {
			pipe.Set(ctx, driver.StorageKey("hf:", p.Name(), "k"+strconv.Itoa(k)), e, time.Minute)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// redisExpired is Redis's count of keys expired since it started (INFO
// stats expired_keys).
func redisExpired(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(infoFields(info)["expired_keys"], 10, 64)
}

func replay(ctx context.Context, r *reconcile.Reconciler, s driver.Store, p core.Policy, id string, n int) error {
	var t0 time.Time
	var failed int
	return replayTimed(ctx, r, s, p, id, n, &t0, &failed)
}

// replayTimed builds the batches of n keys, sets *start, and replays them,
// sending failed batches again until all are acknowledged. *failed is how
// many failed the first time.
func replayTimed(ctx context.Context, r *reconcile.Reconciler, s driver.Store, p core.Policy, id string, n int, start *time.Time, failed *int) error {
	now := time.Now().UnixMicro()
	batches := make([]driver.Batch, n)
	for k := range batches {
		ks := strconv.Itoa(k)
		gs := make([]driver.Grant, grantsPerKey)
		for j := range gs {
			gs[j] = driver.Grant{ID: id + ks + "-" + strconv.Itoa(j), Cost: 1, At: now - int64(grantsPerKey-j)*1000}
		}
		batches[k] = driver.Batch{ID: id + "run:" + ks, Key: driver.StorageKey("hf:", p.Name(), "k"+ks), Policy: p, Grants: gs}
	}
	*start = time.Now()
	*failed = 0
	for attempt := 1; ; attempt++ {
		var again []driver.Batch
		var last error
		for i, err := range r.Reconcile(ctx, s, batches) {
			if err != nil {
				again, last = append(again, batches[i]), err
			}
		}
		if attempt == 1 {
			*failed = len(again)
		}
		if len(again) == 0 {
			return nil
		}
		if attempt == reconcileAttempts {
			return fmt.Errorf("%d batches still failing after %d attempts: %w", len(again), attempt, last)
		}
		// Like the fallback layer, send the failed batches again with the
		// same IDs: one that was applied counts once.
		batches = again
	}
}

// reconcileAttempts bounds the retries of failed batches.
const reconcileAttempts = 5

package harness

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/bench/redisproc"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
)

// recoveryStat is one recovery: from Redis answering again to every
// instance's breaker closed.
type recoveryStat struct {
	// Back is from Redis answering (restarted empty) to every instance
	// closed; First is to the first instance closed.
	Back, First time.Duration
	// Replay is the longest reconciliation any instance logged (its
	// outage log replayed into Redis).
	Replay time.Duration
	// Decisions and Local count the paced load's decisions in Back, and
	// those of them decided locally (Degraded).
	Decisions, Local int64
	// Grants is how many grants the instances held when Redis came back.
	Grants int
}

type recoveryResult struct {
	Backends  []string
	Instances int
	Keys      int // per instance
	Grants    int // per key
	G         int // paced callers per instance
	Pace      time.Duration
	Reps      int
	Runs      map[string][]recoveryStat
}

// recoveryGrants is how many grants each key gets during the outage.
const recoveryGrants = 3

// recovery runs section 7 on a redis-server of its own: Instances
// fallback limiters each grant recoveryGrants requests on Keys keys of
// their own while Redis is down; Redis is restarted empty, and the time
// until every limiter's breaker is closed again is measured, with a paced
// load on every instance throughout.
func (h *harness) recovery(ctx context.Context) error {
	res := &recoveryResult{Backends: h.cfg.OutageBackends, Instances: h.cfg.RecoveryInstances, Keys: h.cfg.RecoveryKeys,
		Grants: recoveryGrants, G: 4, Pace: time.Millisecond, Reps: h.cfg.RecoveryReps, Runs: map[string][]recoveryStat{}}
	h.report.Recovery = res
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	pol, err := hiTB()
	if err != nil {
		return err
	}
	for _, b := range res.Backends {
		mk := rueidisStore
		if b == "go-redis" {
			mk = goredisStore
		}
		var ls []*fallback.Limiter
		var replay replayLog
		closeAll := func() {
			for _, l := range ls {
				_ = l.Close()
			}
		}
		for i := range res.Instances {
			store, closeStore, err := mk(srv.URL())
			if err != nil {
				closeAll()
				return err
			}
			l, err := fallback.New(store, fallback.Options{ID: fmt.Sprintf("rec-%s-%d", b, i), ExpectedInstances: res.Instances,
				Logger: slog.New(&replay), Breaker: fallback.BreakerOptions{CallTimeout: h.cfg.CallTimeout}})
			if err == nil {
				err = l.Start(ctx)
			}
			if err != nil {
				closeStore()
				closeAll()
				return err
			}
			ls = append(ls, l)
			defer closeStore()
		}
		for rep := range res.Reps {
			st, err := h.recoverOnce(ctx, srv, ls, &replay, pol, b, rep)
			if err != nil {
				closeAll()
				return fmt.Errorf("%s: %w", b, err)
			}
			res.Runs[b] = append(res.Runs[b], st)
			h.progress("recovery %-8s rep %d: %d grants, all closed %v after Redis answered (first %v, longest replay %v); %d of %d decisions local meanwhile",
				b, rep+1, st.Grants, st.Back.Round(time.Millisecond), st.First.Round(time.Millisecond), st.Replay.Round(time.Millisecond), st.Local, st.Decisions)
		}
		closeAll()
	}
	return nil
}

// recoverOnce is one repetition: outage, grants, restart, recovery.
func (h *harness) recoverOnce(ctx context.Context, srv *redisproc.Server, ls []*fallback.Limiter, replay *replayLog, pol core.Policy, b string, rep int) (recoveryStat, error) {
	for _, l := range ls {
		if err := waitClosed(ctx, l, 30*time.Second); err != nil {
			return recoveryStat{}, err
		}
	}
	keys := make([][]string, len(ls))
	for i := range ls {
		keys[i] = make([]string, h.cfg.RecoveryKeys)
		for k := range keys[i] {
			keys[i][k] = "r" + strconv.Itoa(rep) + "-i" + strconv.Itoa(i) + "-k" + strconv.Itoa(k)
		}
	}
	srv.Kill()
	// Each breaker opens on its failed calls; then every key's grants are
	// made locally.
	for i, l := range ls {
		for n := 0; l.Breaker().State() != fallback.Open; n++ {
			if n == 1000 {
				return recoveryStat{}, fmt.Errorf("instance %d: breaker still %v with Redis down", i, l.Breaker().State())
			}
			_, _ = l.Allow(ctx, pol, keys[i][0])
		}
		for _, k := range keys[i] {
			for range recoveryGrants {
				if _, err := l.Allow(ctx, pol, k); err != nil {
					return recoveryStat{}, err
				}
			}
		}
	}
	grants := 0
	for _, l := range ls {
		grants += l.Status().PendingLog
	}
	// The paced load: G callers an instance, each deciding every Pace on
	// the instance's keys, from before the restart to after the recovery.
	var recording atomic.Bool
	var decisions, local atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, l := range ls {
		for w := range 4 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(rep), uint64(i*64+w)))
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for n := 0; n < 1<<22; n++ { // bounded: about an hour at the pace
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					r, err := l.Allow(ctx, pol, keys[i][rng.IntN(len(keys[i]))])
					if recording.Load() {
						decisions.Add(1)
						if err == nil && r.Degraded {
							local.Add(1)
						}
					}
				}
			})
		}
	}
	defer func() { close(stop); wg.Wait() }()
	replay.reset()
	if err := srv.Restart(); err != nil {
		return recoveryStat{}, err
	}
	back := time.Now()
	recording.Store(true)
	var first time.Duration
	closed := make([]bool, len(ls))
	for left := len(ls); left > 0; {
		if time.Since(back) > 60*time.Second {
			return recoveryStat{}, fmt.Errorf("%d of %d instances still not closed after 60 s", left, len(ls))
		}
		for i, l := range ls {
			if !closed[i] && l.Breaker().State() == fallback.Closed {
				closed[i], left = true, left-1
				if first == 0 {
					first = time.Since(back)
				}
			}
		}
		if left > 0 {
			sleepCtx(ctx, time.Millisecond)
		}
		if ctx.Err() != nil {
			return recoveryStat{}, ctx.Err()
		}
	}
	st := recoveryStat{Back: time.Since(back), First: first, Replay: replay.longest(), Grants: grants}
	recording.Store(false)
	st.Decisions, st.Local = decisions.Load(), local.Load()
	return st, nil
}

// replayLog is a slog.Handler that keeps the longest "took" of the
// limiters' "holdfast reconciled" lines and drops everything else.
type replayLog struct {
	mu  sync.Mutex
	max time.Duration
}

func (r *replayLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *replayLog) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *replayLog) WithGroup(string) slog.Handler            { return r }

func (r *replayLog) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "holdfast reconciled" {
		return nil
	}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key != "took" {
			return true
		}
		if d, err := time.ParseDuration(a.Value.String()); err == nil {
			r.mu.Lock()
			r.max = max(r.max, d)
			r.mu.Unlock()
		}
		return false
	})
	return nil
}

func (r *replayLog) reset() {
	r.mu.Lock()
	r.max = 0
	r.mu.Unlock()
}

func (r *replayLog) longest() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.max
}

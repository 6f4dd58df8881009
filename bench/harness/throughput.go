package harness

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// cell names one throughput configuration.
type cell struct {
	Impl string
	G    int
	Hot  bool
}

func keysetName(hot bool) string {
	if hot {
		return "hot key"
	}
	return "100k keys"
}

// runStat is one run of one cell.
type runStat struct {
	PerSec    float64
	P50, P99  time.Duration
	Max       time.Duration
	Ops, Errs int64
	Degraded  int64
	Denied    int64
	FirstErr  error
	// RedisUsPerOp is Redis's CPU time (user+sys, INFO cpu) per decision.
	RedisUsPerOp float64
	// ScriptUs is Redis's own time per script call (INFO commandstats:
	// EVALSHA usec_per_call).
	ScriptUs float64
	// ClientUsPerOp is this process's CPU time (user+sys, getrusage) per
	// decision: the client library, plus the harness's timing (two clock
	// reads and a histogram update).
	ClientUsPerOp float64
}

// throughputResult holds sections 1 (all limiters admitting) and 1b (a
// denied hot key).
type throughputResult struct {
	Impls  []string
	Gs     []int
	Runs   map[cell][]runStat // in repetition order, paired across impls
	Denial struct {
		Impls []string
		Gs    []int
		Runs  map[cell][]runStat
	}
}

// throughput runs section 1: for each G and key set, each repetition runs
// every limiter once in turn (A B C … A B C …), so machine noise lands on
// all of them alike.
func (h *harness) throughput(ctx context.Context) error {
	impls := selectImpls(append(throughputImpls(), variantImpls(append(keysDepthVariants(h.cfg.KeysDepths), h.cfg.StoreVariants...))...), h.cfg.Impls)
	res := &throughputResult{Gs: h.cfg.Gs, Runs: map[cell][]runStat{}}
	h.report.Throughput = res
	deciders, closeAll, err := h.openAll(ctx, impls)
	if err != nil {
		return err
	}
	defer closeAll()
	for _, im := range impls {
		res.Impls = append(res.Impls, im.name)
	}
	keys := makeKeys(h.cfg.Keys)
	for _, hot := range h.cfg.keysets() {
		for _, g := range h.cfg.Gs {
			if err := h.admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			for rep := range h.cfg.HeadlineReps {
				for i, im := range impls {
					d := h.cfg.HeadlineDuration
					if !headline(im.name) {
						if rep >= h.cfg.Reps {
							continue
						}
						d = h.cfg.Duration
					}
					c := cell{Impl: im.name, G: g, Hot: hot}
					st, err := h.measure(ctx, im, deciders[i], loadSpec{G: g, Keys: keys, Hot: hot, Seed: uint64(rep), Duration: d})
					if err != nil {
						return err
					}
					res.Runs[c] = append(res.Runs[c], st)
					h.progress("throughput %-32s G=%-3d %-9s rep %d: %8.0f/s p50 %-9v p99 %-9v errs %d degraded %d",
						im.name, g, keysetName(hot), rep+1, st.PerSec, st.P50, st.P99, st.Errs, st.Degraded)
				}
			}
		}
	}
	return nil
}

// headline reports whether limiter name is one of the headline rows:
// holdfast's token bucket on each backend and the peers.
func headline(name string) bool {
	switch name {
	case implHFRueidisTB, implHFGoredisTB, implRedisRate, implUlule:
		return true
	}
	return false
}

// peers are the other libraries holdfast is compared with.
var peers = []string{implRedisRate, implUlule}

// bestPeer is, run by run, the most decisions/s any peer made in the
// repetition: runs[i] of every peer were taken in repetition i. Only
// repetitions every peer ran count.
func bestPeer(runs map[cell][]runStat, g int, hot bool) []float64 {
	var best []float64
	for j, p := range peers {
		rs := runs[cell{Impl: p, G: g, Hot: hot}]
		if j == 0 {
			best = pick(rs, perSec)
			continue
		}
		best = best[:min(len(best), len(rs))]
		for i := range best {
			best[i] = max(best[i], rs[i].PerSec)
		}
	}
	return best
}

// denial runs section 1b: one key hammered far past its limit.
func (h *harness) denial(ctx context.Context) error {
	impls := selectImpls(denialImpls(), h.cfg.Impls)
	if h.report.Throughput == nil {
		h.report.Throughput = &throughputResult{Runs: map[cell][]runStat{}}
	}
	d := &h.report.Throughput.Denial
	d.Runs = map[cell][]runStat{}
	d.Gs = h.cfg.DenialGs
	deciders, closeAll, err := h.openAll(ctx, impls)
	if err != nil {
		return err
	}
	defer closeAll()
	for _, im := range impls {
		d.Impls = append(d.Impls, im.name)
	}
	keys := []string{"hammer"}
	for _, g := range h.cfg.DenialGs {
		for rep := range h.cfg.Reps {
			for i, im := range impls {
				c := cell{Impl: im.name, G: g, Hot: true}
				st, err := h.measure(ctx, im, deciders[i], loadSpec{G: g, Keys: keys, Hot: true, Seed: uint64(rep)})
				if err != nil {
					return err
				}
				d.Runs[c] = append(d.Runs[c], st)
				h.progress("denied key %-44s G=%-3d rep %d: %10.0f/s p50 %-9v p99 %-9v denied %d of %d",
					im.name, g, rep+1, st.PerSec, st.P50, st.P99, st.Denied, st.Ops)
			}
		}
	}
	return nil
}

// openAll opens every limiter on the harness's Redis.
func (h *harness) openAll(ctx context.Context, impls []limiterImpl) ([]decideFunc, func(), error) {
	var ds []decideFunc
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, im := range impls {
		d, c, err := im.open(ctx, h.srv.URL())
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("open %s: %w", im.name, err)
		}
		ds, closers = append(ds, d), append(closers, c)
	}
	return ds, closeAll, nil
}

// measure runs a short unmeasured warm-up, then one measured run, reading
// Redis's CPU and script time around the measured run.
func (h *harness) measure(ctx context.Context, im limiterImpl, d decideFunc, spec loadSpec) (runStat, error) {
	if im.ready != nil {
		if err := im.ready(ctx); err != nil {
			h.note("%s, G=%d %s: measured while not ready: %v", im.name, spec.G, keysetName(spec.Hot), err)
		}
	}
	warm := spec
	warm.Duration = h.cfg.Warmup
	warm.MaxOps = 1 << 40
	// A fallback.Limiter that finds Redis flushed (the sections flush it
	// between cells) opens its breaker and reconciles: a warm-up with local
	// decisions is followed by another once the breaker has closed, so the
	// measured run starts on Redis.
	for try := 0; runLoad(ctx, warm, d).Degraded > 0 && im.ready != nil && try < 3; try++ {
		if err := im.ready(ctx); err != nil {
			h.note("%s, G=%d %s: measured while not ready: %v", im.name, spec.G, keysetName(spec.Hot), err)
			break
		}
	}
	if err := h.admin.ConfigResetStat(ctx).Err(); err != nil {
		return runStat{}, err
	}
	cpu0, err := redisCPU(ctx, h.admin)
	if err != nil {
		return runStat{}, err
	}
	if spec.Duration <= 0 {
		spec.Duration = h.cfg.Duration
	}
	spec.MaxOps = int64(spec.Duration.Seconds()*maxOpsPerSec) + 1
	self0 := selfCPU()
	r := runLoad(ctx, spec, d)
	self1 := selfCPU()
	cpu1, err := redisCPU(ctx, h.admin)
	if err != nil {
		return runStat{}, err
	}
	script, err := scriptUsPerCall(ctx, h.admin)
	if err != nil {
		return runStat{}, err
	}
	st := runStat{
		PerSec: r.PerSec(), P50: r.Hist.Quantile(0.50), P99: r.Hist.Quantile(0.99), Max: r.Hist.Max(),
		Ops: r.Ops, Errs: r.Errs, Degraded: r.Degraded, Denied: r.Ops - r.Errs - r.Allowed, FirstErr: r.FirstErr,
		ScriptUs: script,
	}
	if r.Ops > 0 {
		st.RedisUsPerOp = (cpu1 - cpu0) * 1e6 / float64(r.Ops)
		st.ClientUsPerOp = (self1 - self0).Seconds() * 1e6 / float64(r.Ops)
	}
	return st, nil
}

// maxOpsPerSec bounds every load loop's count: far above any rate this
// machine reaches, so the duration ends a run first.
const maxOpsPerSec = 50_000_000

// selfCPU is this process's CPU time so far (user + sys).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is Redis's used CPU (user + sys) in seconds.
func redisCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	f := infoFields(info)
	return parseFloat(f["used_cpu_user"]) + parseFloat(f["used_cpu_sys"]), nil
}

// scriptUsPerCall is Redis's time per EVALSHA call since the last
// CONFIG RESETSTAT (EVAL when no EVALSHA ran).
func scriptUsPerCall(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	f := infoFields(info)
	for _, name := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		if v, ok := f[name]; ok {
			for kv := range strings.SplitSeq(v, ",") {
				if k, val, ok := strings.Cut(kv, "="); ok && k == "usec_per_call" {
					return parseFloat(val), nil
				}
			}
		}
	}
	return 0, nil
}

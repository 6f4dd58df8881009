package harness

import (
	"fmt"
	"time"

	"github.com/holdfast/holdfast/bench/stats"
)

// A Verdict is one of issue 5's targets checked against this run.
type Verdict struct {
	Target   string
	Measured string
	Met      bool
	// Margin says by how much it was met or missed.
	Margin string
}

// Verdicts checks the targets the run has figures for.
func (r *Report) Verdicts() []Verdict {
	var out []Verdict
	add := func(target, measured string, met bool, margin string) {
		out = append(out, Verdict{Target: target, Measured: measured, Met: met, Margin: margin})
	}
	pct := func(got, want float64) string {
		if want == 0 {
			return "–"
		}
		return fmt.Sprintf("%+.0f%%", 100*(got-want)/want)
	}
	if t := r.Throughput; t != nil {
		for _, hot := range r.Config.keysets() {
			for _, g := range t.Gs {
				hf, rr := t.Runs[cell{implHFRueidisTB, g, hot}], t.Runs[cell{implRedisRate, g, hot}]
				if g < 64 || len(hf) == 0 || len(rr) == 0 {
					continue
				}
				ratio := pairedRatio(pick(hf, perSec), pick(rr, perSec)).Median
				add(fmt.Sprintf("holdfast rueidis ≥ 2× redis_rate, G=%d, %s", g, keysetName(hot)),
					fmt.Sprintf("%.2f× (%s vs %s)", ratio, fmtRate(median(hf, perSec)), fmtRate(median(rr, perSec))),
					ratio >= 2, pct(ratio, 2))
			}
			if hf := t.Runs[cell{implHFRueidisTB, 64, hot}]; len(hf) > 0 {
				v := median(hf, perSec)
				add(fmt.Sprintf("holdfast rueidis ≥ 75k/s at G=64, %s", keysetName(hot)), fmtRate(v), v >= 75_000, pct(v, 75_000))
				p := time.Duration(median(hf, p99))
				add(fmt.Sprintf("holdfast rueidis p99 ≤ 2 ms at G=64, %s", keysetName(hot)), fmtDur(p), p <= 2*time.Millisecond,
					pct(float64(p), float64(2*time.Millisecond)))

			}
			worst, worstG := 0.0, 0
			for _, g := range t.Gs {
				hf, rr := t.Runs[cell{implHFGoredisTB, g, hot}], t.Runs[cell{implRedisRate, g, hot}]
				if len(hf) == 0 || len(rr) == 0 {
					continue
				}
				if ratio := pairedRatio(pick(hf, perSec), pick(rr, perSec)).Median; worstG == 0 || ratio < worst {
					worst, worstG = ratio, g
				}
			}
			if worstG > 0 {
				add(fmt.Sprintf("holdfast go-redis ≥ redis_rate at every G, %s", keysetName(hot)),
					fmt.Sprintf("lowest %.2f× (G=%d)", worst, worstG), worst >= 1, pct(worst, 1))
			}
			for _, im := range []string{implHFRueidisTB, implHFGoredisTB} {
				for _, g := range t.Gs {
					hf, best := t.Runs[cell{im, g, hot}], bestPeer(t.Runs, g, hot)
					if len(hf) == 0 || len(best) == 0 {
						continue
					}
					s := pairedRatio(pick(hf, perSec), best)
					add(fmt.Sprintf("%s ≥ 1.0× the best peer, G=%d, %s", im, g, keysetName(hot)),
						fmt.Sprintf("%.2f× (%.2f×–%.2f×)", s.Median, s.Min, s.Max), s.Median >= 1, pct(s.Median, 1))
				}
			}
		}
		d := &t.Denial
		for _, g := range d.Gs {
			mem, plain := d.Runs[cell{implDenyMemory, g, true}], d.Runs[cell{implDenyNoMemory, g, true}]
			if len(mem) == 0 || len(plain) == 0 {
				continue
			}
			ratio := pairedRatio(pick(mem, perSec), pick(plain, perSec)).Median
			add(fmt.Sprintf("denied hot key ≥ 10× the Redis path, G=%d", g),
				fmt.Sprintf("%.0f× (%s vs %s)", ratio, fmtRate(median(mem, perSec)), fmtRate(median(plain, perSec))), ratio >= 10, pct(ratio, 10))
		}
	}
	if c := r.Ceiling; c != nil {
		for _, hot := range r.Config.keysets() {
			p16 := c.Runs[ceilingCell{16, hot}]
			for _, im := range c.HFImpls {
				for _, g := range c.HFGs {
					hf := c.HF[ceilingHF{im, g, hot}]
					if len(p16) == 0 || len(hf) == 0 {
						continue
					}
					s := pairedRatio(hf, p16)
					add(fmt.Sprintf("%s G=%d ≥ 90%% of pipelined EVALSHA (-P 16), %s", im, g, keysetName(hot)),
						fmt.Sprintf("%.0f%% (%.0f%%–%.0f%%; %s of %s)", 100*s.Median, 100*s.Min, 100*s.Max, fmtRate(median(hf, ident)), fmtRate(median(p16, ident))),
						s.Median >= 0.9, fmt.Sprintf("%+.0f points", 100*(s.Median-0.9)))
				}
			}
		}
	}
	if l := r.Local; l != nil {
		for _, im := range []string{implLocalMemory, implLocalDegraded} {
			for _, p := range l.Procs {
				runs, base := l.Runs[localCell{im, p, true}], l.Runs[localCell{implLocalXRate, p, true}]
				if len(runs) == 0 || len(base) == 0 {
					continue
				}
				ns := func(s localStat) float64 { return s.NsPerOp }
				ratio := pairedRatio(pick(runs, ns), pick(base, ns)).Median
				add(fmt.Sprintf("%s ≤ 2× x/time/rate ns/op, one key, P=%d", im, p),
					fmt.Sprintf("%.2f× (%.0f vs %.0f ns)", ratio, median(runs, ns), median(base, ns)), ratio <= 2, pct(ratio, 2))
				allocs := median(runs, func(s localStat) float64 { return s.AllocsPerOp })
				add(fmt.Sprintf("%s zero allocs/decision, one key, P=%d", im, p), fmt.Sprintf("%.2f allocs/op", allocs), allocs < 0.01, fmt.Sprintf("%+.2f", allocs))
			}
		}
	}
	if o := r.Outage; o != nil {
		dl := o.CallTimeout
		for _, bk := range o.Backends {
			for _, f := range o.Faults {
				runs := o.Runs[outageCell{bk, f}]
				if len(runs) == 0 {
					continue
				}
				p := time.Duration(median(runs, func(s outageStat) float64 { return float64(s.P99) }))
				mx := time.Duration(stats.Summarize(pick(runs, func(s outageStat) float64 { return float64(s.Max) })).Max)
				add(fmt.Sprintf("outage p99 ≤ call deadline (%v), %s %s", dl, bk, f), fmtDur(p), p <= dl, pct(float64(p), float64(dl)))
				add(fmt.Sprintf("outage max ≤ 2× deadline (%v), %s %s, worst run", 2*dl, bk, f), fmtDur(mx), mx <= 2*dl, pct(float64(mx), float64(2*dl)))
			}
		}
	}
	if rc := r.Reconcile; rc != nil {
		for _, alg := range rc.Algs {
			for _, bk := range rc.Backends {
				for _, t := range []struct {
					keys  int
					limit time.Duration
				}{{100_000, 500 * time.Millisecond}, {1_000_000, 5 * time.Second}} {
					c := reconcileCell{bk, alg, t.keys}
					runs := rc.Runs[c]
					if len(runs) == 0 {
						continue
					}
					d := time.Duration(median(runs, func(d time.Duration) float64 { return float64(d) }))
					got := fmt.Sprintf("%s (%.1f µs of Redis CPU a key", fmtDur(d), stats.Summarize(rc.RedisUsPerKey[c]).Median)
					if x := median(rc.Expired[c], func(v int64) float64 { return float64(v) }); x > 0 {
						got += fmt.Sprintf(", %s keys expired meanwhile", fmtRate(x))
					}
					add(fmt.Sprintf("%s keys reconciled ≤ %v, %s, %s", fmtRate(float64(t.keys)), t.limit, alg, bk), got+")",
						d <= t.limit, pct(float64(d), float64(t.limit)))
				}
			}
		}
	}
	if m := r.Memory; m != nil {
		for _, row := range m.Rows {
			if row.Name != memTB {
				continue
			}
			u, d := stats.Summarize(row.UsagePerKey).Median, stats.Summarize(row.DeltaPerKey).Median
			add("token bucket ≤ 100 B of Redis memory per key (MEMORY USAGE)", fmt.Sprintf("%.0f B", u), u <= 100, pct(u, 100))
			add("token bucket ≤ 100 B of Redis memory per key (used_memory delta)", fmt.Sprintf("%.1f B", d), d <= 100, pct(d, 100))
		}
	}
	return out
}

func ident(v float64) float64 { return v }

func median[T any](runs []T, f func(T) float64) float64 { return stats.Summarize(pick(runs, f)).Median }

func (r *Report) targets(b *md) {
	vs := r.Verdicts()
	if len(vs) == 0 {
		return
	}
	met := 0
	for _, v := range vs {
		if v.Met {
			met++
		}
	}
	b.line("## Targets (issues 5 and 15)")
	b.line("")
	b.line("%d of %d met in this run. Margin is the measured figure relative to the target.", met, len(vs))
	b.line("")
	var rows [][]string
	for _, v := range vs {
		verdict := "**missed**"
		if v.Met {
			verdict = "met"
		}
		rows = append(rows, []string{v.Target, v.Measured, verdict, v.Margin})
	}
	b.table([]string{"target", "measured (median)", "verdict", "margin"}, rows)
}

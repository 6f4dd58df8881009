package harness

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/holdfast/holdfast/bench/stats"
)

// Report is one run's figures.
type Report struct {
	Config  Config
	Machine Machine
	// Command is the command line that produced the report.
	Command string
	Started time.Time
	Took    time.Duration
	// LoadEnd is the load average when the run ended.
	LoadEnd string
	// Notes are irregularities of this run.
	Notes []string

	Throughput *throughputResult
	Local      *localResult
	Outage     *outageResult
	Reconcile  *reconcileResult
	Memory     *memoryResult
	Ceiling    *ceilingResult
	Recovery   *recoveryResult
}

// md builds markdown.
type md struct{ strings.Builder }

func (b *md) line(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }

func (b *md) table(header []string, rows [][]string) {
	b.line("| %s |", strings.Join(header, " | "))
	seps := make([]string, len(header))
	for i := range seps {
		seps[i] = "---"
		if i > 0 {
			seps[i] = "--:"
		}
	}
	b.line("| %s |", strings.Join(seps, " | "))
	for _, r := range rows {
		b.line("| %s |", strings.Join(r, " | "))
	}
	b.line("")
}

// Markdown renders the whole report (BENCHMARKS.md).
func (r *Report) Markdown() string {
	var b md
	b.line("# holdfast benchmarks")
	b.line("")
	b.line("> **Figures from one machine, shared and noisy** — a 2-core VM that other work may use at the same")
	b.line("> time. Absolute numbers will differ elsewhere; the ratios, measured in the same run with the")
	b.line("> limiters interleaved (A B A B …), are what carries over. Rerun with `make bench`.")
	b.line("")
	r.machine(&b)
	r.targets(&b)
	r.throughputMD(&b)
	r.denialMD(&b)
	r.localMD(&b)
	r.outageMD(&b)
	r.reconcileMD(&b)
	r.memoryMD(&b)
	r.ceilingMD(&b)
	r.recoveryMD(&b)
	return b.String()
}

func (r *Report) machine(b *md) {
	m := r.Machine
	b.line("## Machine and command")
	b.line("")
	b.line("- CPU: %d × %s (GOMAXPROCS %d); memory %s; Linux %s", m.CPUs, m.Model, m.GOMAXPROCS, m.MemTotal, m.Kernel)
	b.line("- %s; %s", m.GoVersion, m.Redis)
	b.line("- Redis: one `redis-server` started by the harness on a free 127.0.0.1 port, no persistence;")
	b.line("  the harness (clients) and Redis share the 2 cores.")
	b.line("- Command: `%s`", r.Command)
	b.line("- Started %s, took %v. Each figure is the median of %d runs, shown as median (min–max).",
		r.Started.UTC().Format(time.RFC3339), r.Took.Round(time.Second), r.Config.Reps)
	b.line("- Load average (1/5/15 min) at the start: %s; at the end: %s (on 2 cores: above 2 means other", m.Load, r.LoadEnd)
	b.line("  work competed with the run).")
	for _, n := range r.Notes {
		b.line("- Note: %s", n)
	}
	b.line("")
}

// fmtRate prints a rate with a k/M suffix.
func fmtRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// fmtDur prints a duration with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%dns", d.Nanoseconds())
}

func fmtSpread(s stats.Summary, f func(float64) string) string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 {
		return f(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}

func durF(v float64) string { return fmtDur(time.Duration(v)) }

func ratioF(v float64) string { return fmt.Sprintf("%.2f×", v) }

// pick maps runs to one figure each.
func pick[T any](runs []T, f func(T) float64) []float64 {
	out := make([]float64, len(runs))
	for i, x := range runs {
		out[i] = f(x)
	}
	return out
}

// pairedRatio is the spread of a[i]/b[i] over runs taken in the same
// repetition.
func pairedRatio(a, b []float64) stats.Summary {
	n := min(len(a), len(b))
	rs := make([]float64, 0, n)
	for i := range n {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return stats.Summarize(rs)
}

func perSec(s runStat) float64 { return s.PerSec }
func p50(s runStat) float64    { return float64(s.P50) }
func p99(s runStat) float64    { return float64(s.P99) }

func (r *Report) throughputMD(b *md) {
	t := r.Throughput
	if t == nil || len(t.Impls) == 0 {
		return
	}
	b.line("## 1. Decisions per second through Redis")
	b.line("")
	b.line("G callers in a closed loop, each deciding as soon as its last decision returned. The headline rows (holdfast's")
	b.line("token bucket on each backend, redis_rate, ulule) run %d times for %v each, the others the first %d of those", r.Config.HeadlineReps, r.Config.HeadlineDuration, r.Config.Reps)
	b.line("repetitions for %v (each after a %v unmeasured warm-up). Every decision admits (token bucket: capacity %d, %d/s;", r.Config.Duration, r.Config.Warmup, hiLimit, hiPerSec)
	b.line("sliding window (sw) and sliding window counter (sc): %d per 1 s; redis_rate: %d/s burst %d; ulule: %d per", hiLimit, hiPerSec, hiLimit, hiLimit)
	b.line("1 s), so every limiter runs its full write path. holdfast rows use `core.Limiter` over the backend; \"fallback\" is the whole outage-proof")
	b.line("stack (`fallback.Limiter`: breaker, 50 ms call deadline, known-state bookkeeping). go-redis clients have")
	b.line("go-redis's default pool (10 per GOMAXPROCS = 20 connections): holdfast's via `goredis.NewClient`, the")
	b.line("peers' via `redis.NewClient` as their users build it. Ratios are to the best peer of the same repetition")
	b.line("(the faster of redis_rate and ulule in that repetition), paired run by run; the detail table also gives the")
	b.line("ratio to redis_rate.")
	b.line("")
	for _, hot := range r.Config.keysets() {
		b.line("### %s: decisions/s, median (ratio to the best peer, median and min–max)", keysetName(hot))
		b.line("")
		header := []string{"limiter"}
		for _, g := range t.Gs {
			header = append(header, fmt.Sprintf("G=%d", g))
		}
		var rows [][]string
		for _, im := range t.Impls {
			row := []string{im}
			for _, g := range t.Gs {
				runs := t.Runs[cell{Impl: im, G: g, Hot: hot}]
				s := stats.Summarize(pick(runs, perSec))
				cellText := fmtRate(s.Median)
				if anyDegraded(runs) {
					cellText += "†"
				}
				if best := bestPeer(t.Runs, g, hot); len(best) > 0 && !slices.Contains(peers, im) {
					cellText += fmt.Sprintf(" (%s)", fmtSpread(pairedRatio(pick(runs, perSec), best), ratioF))
				}
				row = append(row, cellText)
			}
			rows = append(rows, row)
		}
		b.table(header, rows)
	}
	b.line("† More than 1%% of the decisions in a run were degraded (decided locally because the breaker opened): not a")
	b.line("Redis figure. See the detail table.")
	b.line("")
	b.line("### Detail: min/median/max over runs")
	b.line("")
	b.line("Redis CPU/decision is Redis's user+sys CPU time (INFO cpu) over the run divided by decisions; script is")
	b.line("EVALSHA's own `usec_per_call` (INFO commandstats); client CPU/decision is the harness process's user+sys")
	b.line("time (getrusage) per decision: the client library plus about 0.2 µs of the harness's own timing. On 2 shared")
	b.line("cores, Redis CPU + client CPU per decision is what bounds decisions/s. Errors and degraded (decided locally)")
	b.line("count decisions.")
	b.line("")
	header := []string{"limiter", "keys", "G", "decisions/s", "ratio to best peer", "ratio to redis_rate", "p50", "p99", "Redis CPU/decision", "script", "client CPU/decision", "errors", "degraded"}
	var rows [][]string
	for _, hot := range r.Config.keysets() {
		for _, im := range t.Impls {
			for _, g := range t.Gs {
				runs := t.Runs[cell{Impl: im, G: g, Hot: hot}]
				ratio, toBest := "–", "–"
				if base, ok := t.Runs[cell{Impl: implRedisRate, G: g, Hot: hot}]; ok && im != implRedisRate {
					ratio = fmtSpread(pairedRatio(pick(runs, perSec), pick(base, perSec)), ratioF)
				}
				if best := bestPeer(t.Runs, g, hot); len(best) > 0 && !slices.Contains(peers, im) {
					toBest = fmtSpread(pairedRatio(pick(runs, perSec), best), ratioF)
				}
				var errs, deg int64
				for _, s := range runs {
					errs += s.Errs
					deg += s.Degraded
				}
				rows = append(rows, []string{
					im, keysetName(hot), fmt.Sprint(g),
					fmtSpread(stats.Summarize(pick(runs, perSec)), fmtRate), toBest, ratio,
					fmtSpread(stats.Summarize(pick(runs, p50)), durF),
					fmtSpread(stats.Summarize(pick(runs, p99)), durF),
					fmt.Sprintf("%.1fµs", stats.Summarize(pick(runs, func(s runStat) float64 { return s.RedisUsPerOp })).Median),
					fmt.Sprintf("%.2fµs", stats.Summarize(pick(runs, func(s runStat) float64 { return s.ScriptUs })).Median),
					fmt.Sprintf("%.1fµs", stats.Summarize(pick(runs, func(s runStat) float64 { return s.ClientUsPerOp })).Median),
					fmt.Sprint(errs), fmt.Sprint(deg),
				})
			}
		}
	}
	b.table(header, rows)
	b.line("A run with degraded decisions is not a Redis figure: the breaker opened (3 calls slower than 40 ms, or failed)")
	b.line("and those decisions were local, at memory speed.")
	b.line("")
	if errs := firstErrors(t.Runs); errs != "" {
		b.line("First errors: %s", errs)
		b.line("")
	}
}

// anyDegraded reports a run with more than 1% degraded decisions.
func anyDegraded(runs []runStat) bool {
	for _, s := range runs {
		if s.Degraded*100 > s.Ops {
			return true
		}
	}
	return false
}

func firstErrors(runs map[cell][]runStat) string {
	var out []string
	for c, rs := range runs {
		for _, s := range rs {
			if s.FirstErr != nil {
				out = append(out, fmt.Sprintf("%s G=%d: %v", c.Impl, c.G, s.FirstErr))
				break
			}
		}
	}
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("and %d more", len(out)-5))
	}
	return strings.Join(out, "; ")
}

func (r *Report) denialMD(b *md) {
	if r.Throughput == nil || len(r.Throughput.Denial.Impls) == 0 {
		return
	}
	d := &r.Throughput.Denial
	b.line("## 1b. A hot key far past its limit (denial memory)")
	b.line("")
	b.line("One key, a token bucket of capacity 1 refilled every 10 s, hammered by G callers for %v per run: nearly", r.Config.Duration)
	b.line("every decision is a denial. `fallback.Limiter` on rueidis with its denial memory (the default) against the")
	b.line("same limiter with `NoDenialMemory: true` (every decision a Redis round trip), and redis_rate on a denied key.")
	b.line("Ratio is to NoDenialMemory, paired run by run.")
	b.line("")
	header := []string{"limiter", "G", "decisions/s", "ratio to Redis path", "p50", "p99", "denied", "errors"}
	var rows [][]string
	for _, g := range d.Gs {
		base := d.Runs[cell{Impl: implDenyNoMemory, G: g, Hot: true}]
		for _, im := range d.Impls {
			runs := d.Runs[cell{Impl: im, G: g, Hot: true}]
			var ops, denied, errs int64
			for _, s := range runs {
				ops += s.Ops
				denied += s.Denied
				errs += s.Errs
			}
			ratio := "–"
			if im != implDenyNoMemory && len(base) > 0 {
				ratio = fmtSpread(pairedRatio(pick(runs, perSec), pick(base, perSec)), ratioF)
			}
			rows = append(rows, []string{im, fmt.Sprint(g), fmtSpread(stats.Summarize(pick(runs, perSec)), fmtRate), ratio,
				fmtSpread(stats.Summarize(pick(runs, p50)), durF), fmtSpread(stats.Summarize(pick(runs, p99)), durF),
				fmt.Sprintf("%.4f%%", 100*float64(denied)/float64(max(ops, 1))), fmt.Sprint(errs)})
		}
	}
	b.table(header, rows)
}

func (r *Report) localMD(b *md) {
	l := r.Local
	if l == nil || len(l.Impls) == 0 {
		return
	}
	b.line("## 2. The local path (no Redis)")
	b.line("")
	b.line("Token bucket, capacity %d at %d/s (every decision admits), GOMAXPROCS = P with P goroutines deciding", localCap, localPerSec)
	b.line("at once for %v per run (like `go test -cpu 1,2` with RunParallel): ns/op is wall time per decision.", r.Config.LocalDuration)
	b.line("allocs/op and B/op from runtime.MemStats over the run. Every key was seen once before measuring.")
	b.line("The degraded path is `fallback.Limiter` with its breaker open (`BreakerOptions{Start: fallback.Open}`,")
	b.line("never started): lease decision plus outage log. Ratio is to x/time/rate, paired run by run.")
	b.line("")
	header := []string{"limiter", "P", "keys", "ns/op", "ratio to x/time/rate", "allocs/op", "B/op"}
	var rows [][]string
	for _, hot := range r.Config.keysets() {
		for _, p := range l.Procs {
			base := l.Runs[localCell{Impl: implLocalXRate, Procs: p, Hot: hot}]
			for _, im := range l.Impls {
				runs := l.Runs[localCell{Impl: im, Procs: p, Hot: hot}]
				ns := pick(runs, func(s localStat) float64 { return s.NsPerOp })
				ratio := "–"
				if im != implLocalXRate && len(base) > 0 {
					ratio = fmtSpread(pairedRatio(ns, pick(base, func(s localStat) float64 { return s.NsPerOp })), ratioF)
				}
				rows = append(rows, []string{im, fmt.Sprint(p), keysetName(hot),
					fmtSpread(stats.Summarize(ns), func(v float64) string { return fmt.Sprintf("%.0f", v) }), ratio,
					fmt.Sprintf("%.2f", stats.Summarize(pick(runs, func(s localStat) float64 { return s.AllocsPerOp })).Median),
					fmt.Sprintf("%.0f", stats.Summarize(pick(runs, func(s localStat) float64 { return s.BytesPerOp })).Median)})
			}
		}
	}
	b.table(header, rows)
}

func (r *Report) outageMD(b *md) {
	o := r.Outage
	if o == nil {
		return
	}
	b.line("## 3. Decision latency during an outage")
	b.line("")
	b.line("`fallback.Limiter` with **call deadline %v** (`BreakerOptions.CallTimeout`; breaker opens after 3 failed", o.CallTimeout)
	b.line("or slow calls). %d callers, each deciding every %v on 1000 keys; every decision started in the %v", o.G, o.Pace, o.Window)
	b.line("after the signal is recorded. SIGKILL: Redis is then restarted empty on the same port. SIGSTOP: SIGCONT")
	b.line("after the window. \"back after\" is from the restart/SIGCONT until the breaker is closed again")
	b.line("(probe every 1 s, replay, recovery barrier). %d runs per fault; latencies are median (min–max) over runs.", o.Reps)
	b.line("")
	header := []string{"backend", "fault", "p50", "p99", "max", "decisions", "> deadline", "degraded", "errors", "back after"}
	var rows [][]string
	for _, bk := range o.Backends {
		for _, f := range o.Faults {
			runs := o.Runs[outageCell{Backend: bk, Fault: f}]
			var ops, over, deg, errs int64
			for _, s := range runs {
				ops += s.Ops
				over += s.OverDeadline
				deg += s.Degraded
				errs += s.Errs
			}
			rows = append(rows, []string{bk, f,
				fmtSpread(stats.Summarize(pick(runs, func(s outageStat) float64 { return float64(s.P50) })), durF),
				fmtSpread(stats.Summarize(pick(runs, func(s outageStat) float64 { return float64(s.P99) })), durF),
				fmtSpread(stats.Summarize(pick(runs, func(s outageStat) float64 { return float64(s.Max) })), durF),
				fmt.Sprint(ops), fmt.Sprint(over),
				fmt.Sprintf("%.1f%%", 100*float64(deg)/float64(max(ops, 1))), fmt.Sprint(errs),
				fmtSpread(stats.Summarize(pick(runs, func(s outageStat) float64 { return float64(s.Recovery) })), durF)})
		}
	}
	b.table(header, rows)
}

func (r *Report) reconcileMD(b *md) {
	rc := r.Reconcile
	if rc == nil {
		return
	}
	b.line("## 4. Reconciliation")
	b.line("")
	b.line("An outage log of N keys, one batch of %d grants per key, replayed by `reconcile.New(reconcile.Options{}).Reconcile`", rc.Grants)
	b.line("into an empty Redis (FLUSHALL before every run, as after a restart) through each backend's store (pipelined")
	b.line("`RunMany`; one instance's batches go up to 32 to a script call, their markers in one hash, each 1024 batches' calls sent while the next are built). Sizes up to 100k keys run %d times, larger ones %d.", r.Config.Reps, r.Config.ReconcileBigReps)
	b.line("Only the replay is timed; batches that fail (a pipeline past the client's 50 ms read deadline: unknown")
	b.line("outcome) are sent again with the same IDs, as the fallback layer does, and the time includes that. \"failed\"")
	b.line("counts first-attempt failures over all runs; \"Redis CPU/key\" is Redis's user+sys CPU time (INFO cpu) during the")
	b.line("replay per key: the floor on replay time on one core; \"Redis busy\" is that CPU time over the replay's wall time (near")
	b.line("100%%: Redis, not the client, is the limit). `go test -run x -bench BenchmarkReconcile ./reconcile` runs")
	b.line("the same workload (its redis-µs/key is this Redis CPU/key). The floor rows replay the token bucket's batches, with")
	b.line("its arguments, markers and calls, through a body that only replies (what a key costs before any algorithm's work:")
	b.line("parsing, the Lua loop, its markers and reply) or only SETs its key (adding the one write a token bucket replay")
	b.line("makes of a fresh key). The algorithm rows send each batch whose key is missing in a fresh call first")
	b.line("(`driver.FreshScript`: the client computes the key's value, Redis only writes it), and the sliding window's")
	b.line("batches (no seed units) as plain writes (`RunCommands`: PEXPIRE GT, ZADD, PEXPIRE NX; no script, no marker:")
	b.line("its units are members named by request ids); the \"replay scripts only\" rows")
	b.line("replay the same batches through the replay scripts alone (`reconcile.Options{FreshMin: -1}`), as before fresh")
	b.line("calls, and the \"its keys in Redis\" row replays into a Redis that holds every key (a bucket written by SET first,")
	b.line("untimed, as after a partition): its first slice of fresh calls finds the keys there, and the rest go to the scripts.")
	b.line("\"expired\" is how many keys Redis expired during the replay (INFO stats `expired_keys`, median over runs): a")
	rate := cmp.Or(r.Config.ReconcileTBRate, 10)
	b.line("key's TTL ends when its bucket is full again (here 3 tokens of a %g/s bucket: %.3g s) or its merge log closes", rate, 3/rate)
	b.line("(1 s), whichever is later, so in a replay longer than that Redis deletes the first keys while it writes the")
	b.line("last, on the same core, and their deletion is in the Redis CPU/key. The windows' keys live a minute or more.")
	b.line("`-reconcile-tb-rate 0.1` keeps every key past the replay (30 s): see docs/DESIGN.md, \"Fresh calls\", for that run.")
	b.line("")
	header := []string{"algorithm", "keys"}
	for _, bk := range rc.Backends {
		header = append(header, bk, bk+" keys/s", bk+" Redis CPU/key", bk+" Redis busy", bk+" expired", bk+" failed")
	}
	var rows [][]string
	for _, alg := range append(slices.Clone(rc.Algs), rc.Extra...) {
		for _, n := range rc.Sizes {
			if len(rc.Runs[reconcileCell{Backend: rc.Backends[0], Alg: alg, Keys: n}]) == 0 {
				continue // an extra row above 100k keys
			}
			row := []string{alg, fmt.Sprint(n)}
			for _, bk := range rc.Backends {
				runs := rc.Runs[reconcileCell{Backend: bk, Alg: alg, Keys: n}]
				s := stats.Summarize(pick(runs, func(d time.Duration) float64 { return float64(d) }))
				c := reconcileCell{Backend: bk, Alg: alg, Keys: n}
				cpu := stats.Summarize(rc.RedisUsPerKey[c]).Median
				row = append(row, fmtSpread(s, durF), fmtRate(float64(n)/time.Duration(s.Median).Seconds()),
					fmt.Sprintf("%.1fµs", cpu), fmt.Sprintf("%.0f%%", 100*cpu*float64(n)/(s.Median/1e3)), fmtRate(stats.Summarize(pick(rc.Expired[c], func(v int64) float64 { return float64(v) })).Median), fmt.Sprint(rc.Failed[c]))
			}
			rows = append(rows, row)
		}
	}
	b.table(header, rows)
}

func (r *Report) memoryMD(b *md) {
	m := r.Memory
	if m == nil {
		return
	}
	b.line("## 5. Redis memory per key")
	b.line("")
	b.line("%d keys, one decision each, on a fresh redis-server (jemalloc). MEMORY USAGE (SAMPLES 0) is the median over", m.Keys)
	b.line("%d keys spread over the set (per-request rows: over 1000 keys, or the one large key); the used_memory delta", m.Sample)
	b.line("includes Redis's keyspace and expiry dictionaries. Client keys are `k000000`…; the storage key name is shown.")
	b.line("")
	header := []string{"layout", "storage key", "MEMORY USAGE", "used_memory delta"}
	var rows [][]string
	for _, row := range m.Rows {
		rows = append(rows, []string{row.Name, "`" + row.KeyExample + "`",
			fmt.Sprintf("%.0f B", stats.Summarize(row.UsagePerKey).Median),
			fmtSpread(stats.Summarize(row.DeltaPerKey), func(v float64) string { return fmt.Sprintf("%.1f B", v) })})
	}
	b.table(header, rows)
	b.line("")
	b.line("The used_memory delta has a floor that no value encoding lowers. On Redis 7.0 with jemalloc (size classes 8, 16,")
	b.line("32, 48 …), a key with a TTL costs its keyspace dictEntry (24 B, allocated as 32), its name (an sds of 15 characters")
	b.line("here: 32), its expiry dictEntry (32) and its share of the two hash tables (8 B a slot, 131072 slots for 100k keys:")
	b.line("10.5 B a key in each), about 117 B, before its value. ulule's value is a small counter, one of Redis's shared integer")
	b.line("objects (no allocation), so its row is that floor; holdfast's token bucket value is one integer too, but an instant")
	b.line("in microseconds, beyond the shared ones: a 16 B object, hence 133 B. A target of 100 B per key as a used_memory")
	b.line("delta is below what any limiter keeping one expiring key per client costs here; MEMORY USAGE is the key's own share.")
	b.line("The sliding window counter's key is one string, `window:current:previous` in decimal (12 characters here), whatever")
	b.line("the traffic: further requests only change its digits (docs/slidingcounter.md measures the longer strings of larger")
	b.line("limits), where the sliding window's sorted set grows by a member a request.")
}

func (r *Report) ceilingMD(b *md) {
	c := r.Ceiling
	if c == nil {
		return
	}
	b.line("## 6. The Redis ceiling")
	b.line("")
	b.line("`redis-benchmark` sending EVALSHA of holdfast's token-bucket script (loaded with SCRIPT LOAD; the arguments of")
	b.line("section 1's token bucket), %d clients, %d requests per pipelined run and half that unpipelined; random keys", c.Clients, c.Requests)
	b.line("via `__rand_int__` inside the hash tag. In each of %d repetitions holdfast's token bucket (`core.Limiter`) on each", r.Config.HeadlineReps)
	b.line("backend, at G=64 and G=256 on the same key set for %v, runs right after, and its fraction of the ceiling is", r.Config.HeadlineDuration)
	b.line("paired run by run: median (min–max).")
	b.line("")
	header := []string{"keys", "redis-benchmark -P 1", "redis-benchmark -P 16"}
	for _, im := range c.HFImpls {
		for _, g := range c.HFGs {
			header = append(header, fmt.Sprintf("%s G=%d", im, g), "/ -P 16")
		}
	}
	var rows [][]string
	for _, hot := range r.Config.keysets() {
		p1, p16 := c.Runs[ceilingCell{1, hot}], c.Runs[ceilingCell{16, hot}]
		pct := func(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }
		row := []string{keysetName(hot), fmtSpread(stats.Summarize(p1), fmtRate), fmtSpread(stats.Summarize(p16), fmtRate)}
		for _, im := range c.HFImpls {
			for _, g := range c.HFGs {
				hf := c.HF[ceilingHF{im, g, hot}]
				row = append(row, fmtSpread(stats.Summarize(hf), fmtRate), fmtSpread(pairedRatio(hf, p16), pct))
			}
		}
		rows = append(rows, row)
	}
	b.table(header, rows)
	b.line("Commands (one repetition):")
	b.line("")
	for _, hot := range r.Config.keysets() {
		for _, p := range []int{1, 16} {
			b.line("    %s", c.Commands[ceilingCell{p, hot}])
		}
	}
	b.line("")
	r.floorMD(b)
}

// floorMD renders the script floor of section 6.
func (r *Report) floorMD(b *md) {
	f := r.Ceiling.Floor
	if f == nil || len(f.Us) == 0 {
		return
	}
	b.line("### The script floor: one client")
	b.line("")
	b.line("What a lone caller's decision costs Redis, script by script: `redis-benchmark -c 1`, %d calls a run, one run per", f.Requests)
	b.line("script and key set in each of %d repetitions, after FLUSHALL and CONFIG RESETSTAT; \"µs a call\" is EVALSHA's", r.Config.HeadlineReps)
	b.line("`usec_per_call`, \"calls/s\" redis-benchmark's own rate (a C client: the round trip with the least client")
	b.line("time). The two floors are not limiters: each runs the fewest commands its algorithm needs, with no checks and")
	b.line("(the token bucket) no expiry kept. ulule's decision is a fixed window; holdfast's is a token bucket on Redis's")
	b.line("clock, which no script can decide without reading the clock, the state, and writing the state.")
	b.line("")
	header := []string{"script", "runs", "µs a call, hot key", "µs a call, " + keysetName(false), "calls/s, hot key", "calls/s, " + keysetName(false)}
	us := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	var rows [][]string
	for _, s := range f.Scripts {
		row := []string{s.Name, s.Does}
		for _, hot := range []bool{true, false} {
			row = append(row, fmtSpread(stats.Summarize(f.Us[floorCell{s.Name, hot}]), us))
		}
		for _, hot := range []bool{true, false} {
			row = append(row, fmtSpread(stats.Summarize(f.PerSec[floorCell{s.Name, hot}]), fmtRate))
		}
		rows = append(rows, row)
	}
	b.table(header, rows)
	pct := func(v float64) string { return fmt.Sprintf("%.2f×", v) }
	for _, hot := range r.Config.keysets() {
		fw, tb, hf := f.PerSec[floorCell{floorFWName, hot}], f.PerSec[floorCell{FloorTBName, hot}], f.PerSec[floorCell{floorHFName, hot}]
		b.line("- %s: calls/s of the token bucket floor against the fixed window floor, paired run by run, %s; holdfast's", keysetName(hot), fmtSpread(pairedRatio(tb, fw), pct))
		b.line("  token bucket against the fixed window floor %s, against the token bucket floor %s.", fmtSpread(pairedRatio(hf, fw), pct), fmtSpread(pairedRatio(hf, tb), pct))
	}
	b.line("")
	b.line("Command (holdfast's script, hot key, one repetition):")
	b.line("")
	b.line("    %s", f.Command)
	b.line("")
}

func (r *Report) recoveryMD(b *md) {
	rc := r.Recovery
	if rc == nil || len(rc.Runs) == 0 {
		return
	}
	b.line("## 7. Recovery end to end")
	b.line("")
	b.line("%d `fallback.Limiter` instances (one client each, `ExpectedInstances: %d`, the default breaker: probe every 1 s,", rc.Instances, rc.Instances)
	b.line("call deadline %v) on one redis-server. Redis is killed; each instance's breaker opens and it admits %d", r.Config.CallTimeout, rc.Grants)
	b.line("requests locally on each of %d keys of its own (%d keys in all). Redis is restarted empty, and \"all closed\"", rc.Keys, rc.Instances*rc.Keys)
	b.line("is the time from Redis answering again to every instance's breaker closed: the probe's wait, the replay of the")
	b.line("outage logs and the recovery barrier (which holds each instance until every instance it counted has replayed,")
	b.line("or at most two probe intervals and two call deadlines). \"longest replay\" is the longest reconciliation any instance logged. Throughout, %d", rc.G)
	b.line("callers an instance decide every %v on its keys; \"local\" counts their decisions made locally (at their 1/N", rc.Pace)
	b.line("share) within \"all closed\". \"log entries\" is what the instances held when Redis came back (a key's grants")
	b.line("within a millisecond are one entry of a token bucket's log). %d runs per backend: median (min–max).", rc.Reps)
	b.line("")
	header := []string{"backend", "log entries", "all closed", "first closed", "longest replay", "decisions meanwhile", "local"}
	var rows [][]string
	for _, bk := range rc.Backends {
		runs := rc.Runs[bk]
		if len(runs) == 0 {
			continue
		}
		d := func(f func(recoveryStat) time.Duration) string {
			return fmtSpread(stats.Summarize(pick(runs, func(s recoveryStat) float64 { return float64(f(s)) })), durF)
		}
		n := func(f func(recoveryStat) int64) string {
			return fmtSpread(stats.Summarize(pick(runs, func(s recoveryStat) float64 { return float64(f(s)) })), func(v float64) string { return fmt.Sprintf("%.0f", v) })
		}
		rows = append(rows, []string{bk,
			n(func(s recoveryStat) int64 { return int64(s.Grants) }),
			d(func(s recoveryStat) time.Duration { return s.Back }),
			d(func(s recoveryStat) time.Duration { return s.First }),
			d(func(s recoveryStat) time.Duration { return s.Replay }),
			n(func(s recoveryStat) int64 { return s.Decisions }),
			n(func(s recoveryStat) int64 { return s.Local })})
	}
	b.table(header, rows)
}

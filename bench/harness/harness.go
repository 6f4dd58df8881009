// Package harness is holdfast's benchmark harness: it measures holdfast and
// its peers side by side, in one run, against a redis-server it starts on a
// loopback port, and writes the figures as a report (BENCHMARKS.md).
//
// Every figure is the median of Config.Reps runs, and every comparison is
// taken in the same run, the limiters interleaved (A B A B) so that the
// noise of a shared machine lands on all of them alike.
package harness

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/bench/redisproc"
)

// Sections, in the order they run.
const (
	SectionThroughput = "throughput" // 1: decisions/s and latency through Redis
	SectionDenial     = "denial"     // 1b: a hot key past its limit
	SectionLocal      = "local"      // 2: the in-process path
	SectionOutage     = "outage"     // 3: decision latency while Redis dies or stalls
	SectionReconcile  = "reconcile"  // 4: replaying outage logs
	SectionMemory     = "memory"     // 5: Redis memory per key
	SectionCeiling    = "ceiling"    // 6: redis-benchmark EVALSHA of the script
	SectionRecovery   = "recovery"   // 7: instances back to Redis after a restart
)

// AllSections lists every section.
var AllSections = []string{SectionThroughput, SectionDenial, SectionLocal, SectionOutage, SectionReconcile, SectionMemory, SectionCeiling, SectionRecovery}

// Config sets what the harness runs and for how long. Use Default or Quick
// and change fields.
type Config struct {
	Sections []string
	// Impls, when not empty, keeps only the limiters whose names contain
	// one of these strings (case-insensitive).
	Impls []string
	// Reps is how many runs each figure is the median of.
	Reps int

	// Section 1.
	Duration time.Duration // one measured run of one cell
	Warmup   time.Duration // unmeasured, before each run
	// HeadlineReps and HeadlineDuration are the runs of the headline
	// limiters (holdfast's token bucket on each backend and the peers) in
	// sections 1 and 6: the other limiters of section 1 run in the first
	// Reps of them, for Duration.
	HeadlineReps     int
	HeadlineDuration time.Duration
	Gs               []int    // concurrent callers
	Keysets          []string // "hot", "random" or both
	Keys             int      // the random key set's size
	DenialGs         []int    // section 1b's callers
	// KeysDepths adds rows of holdfast's token bucket on each backend with
	// each of these StoreOptions.KeysDepth (calls of several keys).
	KeysDepths []int
	// StoreVariants adds rows of holdfast's token bucket with each of
	// these store and client options (ParseStoreVariant).
	StoreVariants []StoreVariant

	// Section 2.
	LocalDuration time.Duration
	Procs         []int // GOMAXPROCS values

	// Section 3.
	OutageWindow   time.Duration // measured after each fault
	OutageReps     int           // runs per fault; 0 means Reps
	OutageG        int           // paced callers
	OutagePace     time.Duration // each caller's gap between calls
	CallTimeout    time.Duration // fallback.BreakerOptions.CallTimeout
	OutageBackends []string      // "rueidis", "go-redis"

	// Section 4.
	ReconcileSizes []int
	// ReconcileBigReps is the runs of each size above 100k keys.
	ReconcileBigReps int
	// ReconcileTBRate is the refill rate (tokens/s) of section 4's token
	// bucket of 100: its keys live until the bucket refills 3 tokens or
	// the 1 s merge window ends, whichever is later. 0 means 10.
	ReconcileTBRate float64

	// Section 5.
	MemoryKeys int

	// Section 6.
	CeilingRequests int
	CeilingRandom   int // -r of redis-benchmark

	// Section 7.
	RecoveryInstances int // fallback limiters on one Redis
	RecoveryKeys      int // keys each holds grants of
	RecoveryReps      int

	// Progress receives one line per run; nil means none.
	Progress io.Writer
}

// Default is the full run: about 8 minutes on a 2-core machine.
func Default() Config {
	return Config{
		Sections: AllSections, Reps: 3,
		Duration: time.Second, Warmup: 150 * time.Millisecond,
		HeadlineReps: 5, HeadlineDuration: 2 * time.Second,
		Gs: []int{1, 16, 64, 256}, Keysets: []string{"hot", "random"}, Keys: 100_000,
		DenialGs:      []int{1, 64},
		LocalDuration: 400 * time.Millisecond, Procs: []int{1, 2},
		OutageWindow: 5 * time.Second, OutageG: 16, OutagePace: time.Millisecond,
		CallTimeout: 50 * time.Millisecond, OutageBackends: []string{"rueidis", "go-redis"},
		ReconcileSizes: []int{1_000, 10_000, 100_000, 1_000_000}, ReconcileBigReps: 3,
		MemoryKeys:      100_000,
		CeilingRequests: 200_000, CeilingRandom: 100_000,
		RecoveryInstances: 4, RecoveryKeys: 25_000, RecoveryReps: 3,
	}
}

// Quick is a smoke run of every section in under a minute. Its figures
// are indicative only.
func Quick() Config {
	c := Default()
	c.Duration, c.Warmup = 80*time.Millisecond, 15*time.Millisecond
	c.HeadlineReps, c.HeadlineDuration = c.Reps, c.Duration
	c.LocalDuration = 50 * time.Millisecond
	c.OutageWindow, c.OutageBackends, c.OutageReps = 1500*time.Millisecond, []string{"rueidis"}, 1
	c.ReconcileSizes = []int{1_000, 10_000}
	c.MemoryKeys = 10_000
	c.CeilingRequests = 20_000
	c.RecoveryKeys, c.RecoveryReps = 2_500, 1
	return c
}

func (c *Config) keysets() []bool {
	var out []bool
	if slices.Contains(c.Keysets, "hot") {
		out = append(out, true)
	}
	if slices.Contains(c.Keysets, "random") {
		out = append(out, false)
	}
	return out
}

func (c *Config) has(section string) bool { return slices.Contains(c.Sections, section) }

// Validate reports nonsense settings.
func (c *Config) Validate() error {
	for _, s := range c.Sections {
		if !slices.Contains(AllSections, s) {
			return fmt.Errorf("harness: unknown section %q (have %s)", s, strings.Join(AllSections, ", "))
		}
	}
	for _, k := range c.Keysets {
		if k != "hot" && k != "random" {
			return fmt.Errorf("harness: unknown key set %q (want hot, random)", k)
		}
	}
	for _, b := range c.OutageBackends {
		if b != "rueidis" && b != "go-redis" {
			return fmt.Errorf("harness: unknown outage backend %q (want rueidis, go-redis)", b)
		}
	}
	if c.HeadlineReps < c.Reps {
		c.HeadlineReps = c.Reps
	}
	if c.HeadlineDuration <= 0 {
		c.HeadlineDuration = c.Duration
	}
	if c.ReconcileBigReps < 1 {
		c.ReconcileBigReps = c.Reps
	}
	if c.Reps < 1 || c.Duration <= 0 || c.LocalDuration <= 0 || c.OutageWindow <= 0 || c.CallTimeout <= 0 || c.Keys < 1 || c.OutageG < 1 {
		return fmt.Errorf("harness: reps, durations, keys and callers must be positive")
	}
	for _, g := range append(slices.Clone(c.Gs), c.DenialGs...) {
		if g < 1 || g > 4096 {
			return fmt.Errorf("harness: %d callers out of range [1, 4096]", g)
		}
	}
	return nil
}

// harness is one run.
type harness struct {
	cfg    Config
	srv    *redisproc.Server
	admin  *redis.Client
	report *Report
}

// Run runs the configured sections and returns the report. It starts its
// own redis-servers and stops them before returning.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg, Machine: describeMachine(), Started: time.Now()}
	srv, err := redisproc.Start()
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer admin.Close()
	h := &harness{cfg: cfg, srv: srv, admin: admin, report: rep}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{SectionThroughput, h.throughput}, {SectionDenial, h.denial}, {SectionLocal, h.local},
		{SectionOutage, h.outage}, {SectionReconcile, h.reconcile}, {SectionMemory, h.memory},
		{SectionCeiling, h.ceiling}, {SectionRecovery, h.recovery},
	}
	for _, s := range steps {
		if !cfg.has(s.name) {
			continue
		}
		t0 := time.Now()
		if err := s.run(ctx); err != nil {
			return rep, fmt.Errorf("section %s: %w", s.name, err)
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		h.progress("section %s took %v", s.name, time.Since(t0).Round(time.Millisecond))
	}
	rep.Took = time.Since(rep.Started)
	rep.LoadEnd = loadAvg()
	return rep, nil
}

// note records something the reader of the report must know about this
// run (a limiter that was not ready, a fault that could not be measured).
func (h *harness) note(format string, args ...any) {
	h.report.Notes = append(h.report.Notes, fmt.Sprintf(format, args...))
	h.progress("NOTE: "+format, args...)
}

func (h *harness) progress(format string, args ...any) {
	if h.cfg.Progress != nil {
		fmt.Fprintf(h.cfg.Progress, format+"\n", args...)
	}
}

// infoFields parses an INFO reply into its key:value fields.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	return f
}

func parseFloat(s string) float64 {
	v, _ := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return v
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

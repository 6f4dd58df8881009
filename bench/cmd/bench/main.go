// Command bench runs holdfast's benchmark harness: holdfast and its peers
// side by side against a redis-server it starts on a loopback port. It
// prints the report and, with -out, writes it (make bench writes
// BENCHMARKS.md).
//
//	go run ./cmd/bench                 # everything, about 8 minutes
//	go run ./cmd/bench -quick          # every section in under a minute
//	go run ./cmd/bench -sections throughput -impls "rueidis tb" -g 64 -keysets hot -cpuprofile cpu.prof
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/bench/harness"
	"github.com/holdfast/holdfast/bench/redisproc"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "a smoke run of every section in under a minute (indicative figures)")
	sections := flag.String("sections", "all", "comma-separated sections: all or "+strings.Join(harness.AllSections, ","))
	impls := flag.String("impls", "", "comma-separated substrings: keep only limiters whose names contain one")
	reps := flag.Int("reps", 0, "runs per figure (0: 3)")
	dur := flag.Duration("d", 0, "one measured throughput run (0: 1s, -quick 80ms)")
	hreps := flag.Int("headline-reps", 0, "runs of the headline limiters in sections 1 and 6 (0: 5, -quick as -reps)")
	hdur := flag.Duration("headline-d", 0, "one measured run of a headline limiter (0: 2s, -quick as -d)")
	localDur := flag.Duration("local-d", 0, "one measured local-path run (0: 400ms, -quick 50ms)")
	depths := flag.String("keys-depths", "", "comma-separated StoreOptions.KeysDepth values: section 1 adds holdfast tb rows on both backends with each (-1: none)")
	variants := flag.String("store-variants", "", "comma-separated store option sets, each options joined by '+' (keysdepth=N, keysfrom=N, nocollapse, nocoalesce, pipelines=N, maxbatch=N, pool=N): section 1 adds holdfast tb rows with each, on the backends it applies to")
	gs := flag.String("g", "", "comma-separated concurrent callers for section 1 (default 1,16,64,256)")
	keysets := flag.String("keysets", "", "hot, random or hot,random (default both)")
	window := flag.Duration("outage-window", 0, "measured window after each fault (0: 5s, -quick 1.5s)")
	sizes := flag.String("reconcile-sizes", "", "comma-separated outage log sizes (keys) for section 4 (default 1000,10000,100000,1000000)")
	tbRate := flag.Float64("reconcile-tb-rate", 0, "refill rate (tokens/s) of section 4's token bucket of 100 (0: 10; 0.1 keeps every key past a 1M-key replay)")
	callTimeout := flag.Duration("call-timeout", 0, "fallback call deadline for section 3 (0: 50ms)")
	out := flag.String("out", "", "write the markdown report to this file")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the harness process to this file")
	flag.Parse()

	cfg := harness.Default()
	if *quick {
		cfg = harness.Quick()
	}
	if *sections != "all" {
		cfg.Sections = split(*sections)
	}
	cfg.Impls = split(*impls)
	if *reps > 0 {
		cfg.Reps = *reps
	}
	if *dur > 0 {
		cfg.Duration = *dur
	}
	if *hreps > 0 {
		cfg.HeadlineReps = *hreps
	}
	if *hdur > 0 {
		cfg.HeadlineDuration = *hdur
	}
	if *localDur > 0 {
		cfg.LocalDuration = *localDur
	}
	if *gs != "" {
		cfg.Gs = nil
		for _, s := range split(*gs) {
			g, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("-g: %w", err)
			}
			cfg.Gs = append(cfg.Gs, g)
		}
	}
	for _, s := range split(*depths) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("-keys-depths: %w", err)
		}
		cfg.KeysDepths = append(cfg.KeysDepths, n)
	}
	for _, s := range split(*variants) {
		v, err := harness.ParseStoreVariant(s)
		if err != nil {
			return fmt.Errorf("-store-variants: %w", err)
		}
		cfg.StoreVariants = append(cfg.StoreVariants, v)
	}
	if *sizes != "" {
		cfg.ReconcileSizes = nil
		for _, s := range split(*sizes) {
			n, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("-reconcile-sizes: %w", err)
			}
			cfg.ReconcileSizes = append(cfg.ReconcileSizes, n)
		}
	}
	cfg.ReconcileTBRate = *tbRate
	if *keysets != "" {
		cfg.Keysets = split(*keysets)
	}
	if *window > 0 {
		cfg.OutageWindow = *window
	}
	if *callTimeout > 0 {
		cfg.CallTimeout = *callTimeout
	}
	cfg.Progress = os.Stderr
	// go-redis logs each failed dial; the outage section makes many on
	// purpose.
	redis.SetLogger(quiet{})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A second signal, or one during shutdown, still stops our servers.
	defer redisproc.StopAll()

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	t0 := time.Now()
	rep, err := harness.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Command = command()
	md := rep.Markdown()
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %s (%v)\n", *out, time.Since(t0).Round(time.Second))
	}
	return nil
}

// quiet drops go-redis's log lines.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// command is the command line as a user would type it.
func command() string {
	args := make([]string, 0, len(os.Args))
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		args = append(args, a)
	}
	c := strings.TrimSpace("cd bench && go run ./cmd/bench " + strings.Join(args, " "))
	if os.Getenv("MAKELEVEL") != "" {
		c = "make bench  # runs: " + c
	}
	return c
}

package harness

import (
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
)

// RedisBenchmark is the redis-benchmark binary (Debian's redis-tools).
var RedisBenchmark = "/usr/bin/redis-benchmark"

type ceilingCell struct {
	Pipeline int
	Hot      bool
}

type ceilingResult struct {
	Clients  int
	Requests int
	Commands map[ceilingCell]string
	Runs     map[ceilingCell][]float64 // requests per second
	// HF is holdfast (token bucket, core.Limiter) per backend, G and key
	// set, run right after redis-benchmark in each repetition.
	HF map[ceilingHF][]float64
	// HFImpls and HFGs are the holdfast rows.
	HFImpls []string
	HFGs    []int
	// Floor is the script floor: reference scripts from one client.
	Floor *floorResult
}

type ceilingHF struct {
	Impl string
	G    int
	Hot  bool
}

const ceilingClients = 64

// ceiling runs section 6: redis-benchmark sends EVALSHA of holdfast's
// token-bucket script (the same arguments as section 1's token bucket) from
// 64 clients, unpipelined and 16 deep, to one hot key and to random keys,
// and the script floor (runFloor) from one client.
// Each repetition also runs holdfast on each backend at G=64 and G=256
// right after, so the fraction of the ceiling it reaches is paired run by
// run.
func (h *harness) ceiling(ctx context.Context) error {
	res := &ceilingResult{Clients: ceilingClients, Requests: h.cfg.CeilingRequests, Commands: map[ceilingCell]string{},
		Runs: map[ceilingCell][]float64{}, HF: map[ceilingHF][]float64{},
		HFImpls: []string{implHFRueidisTB, implHFGoredisTB}, HFGs: []int{64, 256}}
	h.report.Ceiling = res
	if err := h.admin.FlushAll(ctx).Err(); err != nil {
		return err
	}
	sha, err := h.admin.ScriptLoad(ctx, tokenbucket.Algorithm.Script().Source()).Result()
	if err != nil {
		return err
	}
	pol, err := hiTB()
	if err != nil {
		return err
	}
	args := tokenbucket.Algorithm.Args(pol, 1, "", 0)
	impls := []limiterImpl{{name: implHFRueidisTB, open: coreOn(hiTB, rueidisStore)}, {name: implHFGoredisTB, open: coreOn(hiTB, goredisStore)}}
	deciders, closeAll, err := h.openAll(ctx, impls)
	if err != nil {
		return err
	}
	defer closeAll()
	keys := makeKeys(h.cfg.Keys)
	res.Floor = &floorResult{Requests: max(h.cfg.CeilingRequests/4, 100), Scripts: FloorScripts(tokenbucket.Algorithm.Script().Source(), args),
		Us: map[floorCell][]float64{}, PerSec: map[floorCell][]float64{}}
	for rep := range h.cfg.HeadlineReps {
		if err := h.runFloor(ctx, res.Floor, rep); err != nil {
			return err
		}
		if err := h.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		for _, hot := range h.cfg.keysets() {
			for _, p := range []int{1, 16} {
				if err := h.runCeiling(ctx, res, ceilingCell{p, hot}, sha, args, rep); err != nil {
					return err
				}
			}
			for _, g := range res.HFGs {
				for i, im := range impls {
					st, err := h.measure(ctx, im, deciders[i], loadSpec{G: g, Keys: keys, Hot: hot, Seed: uint64(rep), Duration: h.cfg.HeadlineDuration})
					if err != nil {
						return err
					}
					c := ceilingHF{Impl: im.name, G: g, Hot: hot}
					res.HF[c] = append(res.HF[c], st.PerSec)
					h.progress("ceiling %s G=%d %-9s rep %d: %.0f decisions/s", im.name, g, keysetName(hot), rep+1, st.PerSec)
				}
			}
		}
	}
	return h.admin.FlushAll(ctx).Err()
}

// runCeiling runs redis-benchmark once for cell c. Unpipelined runs send
// half the requests: they are slower.
func (h *harness) runCeiling(ctx context.Context, res *ceilingResult, c ceilingCell, sha string, args []string, rep int) error {
	n := h.cfg.CeilingRequests
	if c.Pipeline == 1 {
		n /= 2
	}
	key := "hf:{tb:hot}"
	cmd := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(h.srv.Port()), "-n", strconv.Itoa(n),
		"-c", strconv.Itoa(ceilingClients), "-P", strconv.Itoa(c.Pipeline), "--csv"}
	if !c.Hot {
		key = "hf:{tb:__rand_int__}"
		cmd = append(cmd, "-r", strconv.Itoa(h.cfg.CeilingRandom))
	}
	cmd = append(cmd, "EVALSHA", sha, "1", key)
	cmd = append(cmd, args...)
	rps, err := redisBenchmark(ctx, cmd)
	if err != nil {
		return err
	}
	res.Commands[c] = "redis-benchmark " + strings.Join(cmd, " ")
	res.Runs[c] = append(res.Runs[c], rps)
	h.progress("ceiling EVALSHA -P %-2d %-9s rep %d: %.0f requests/s", c.Pipeline, keysetName(c.Hot), rep+1, rps)
	return nil
}

// redisBenchmark runs redis-benchmark and parses the requests per second of
// its CSV line.
func redisBenchmark(ctx context.Context, args []string) (float64, error) {
	out, err := exec.CommandContext(ctx, RedisBenchmark, args...).Output()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w", err)
	}
	return parseBenchmarkCSV(string(out))
}

// parseBenchmarkCSV reads redis-benchmark --csv output: a header row
// "test","rps",... and one row per test.
func parseBenchmarkCSV(out string) (float64, error) {
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark output: %w", err)
	}
	for _, r := range rows {
		if len(r) >= 2 && r[0] != "test" {
			v, err := strconv.ParseFloat(r[1], 64)
			if err != nil {
				return 0, fmt.Errorf("redis-benchmark rps %q: %w", r[1], err)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("redis-benchmark printed no result: %q", out)
}

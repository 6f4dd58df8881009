package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// A Script is one row of section 6's script floor: a script that
// redis-benchmark sends from one client, as a lone caller does, to measure
// what Redis spends on a call of it (INFO commandstats) and the round trips
// a second one client makes with it. cmd/scriptcost counts its
// instructions.
type Script struct {
	Name string
	Does string // what it runs, for the table
	Src  string
	Args []string // ARGV
}

// The floor scripts. The two floors are not limiters: they run the fewest
// commands each algorithm needs and nothing else (no argument checks, no
// expiry management for the token bucket, a reply of one or two
// integers).
const (
	floorEmpty = "#!lua\nreturn 1\n"
	floorClock = "#!lua\nlocal t = redis.call('TIME')\nreturn t[1] * 1000000 + t[2]\n"
	// A fixed window: count the request, and give a new window its
	// expiry; the reply is the count and the window's time left.
	floorFixedWindow = `#!lua
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {n, tonumber(ARGV[2])}
end
return {n, redis.call('PTTL', KEYS[1])}
`
	// A token bucket on Redis's clock: read the clock, read the state,
	// write the state (INCRBY: an integer changed in place, its expiry
	// kept, the cheapest write Redis has).
	floorTokenBucket = `#!lua
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local e = tonumber(redis.call('GET', KEYS[1])) or now
redis.call('INCRBY', KEYS[1], ARGV[1])
return 1
`
)

// The names of the rows that the paired ratios (floorMD) compare;
// FloorTBName is also the row cmd/scriptcost's probes start from.
const (
	floorFWName = "fixed window floor"
	FloorTBName = "token bucket floor"
	floorHFName = "holdfast token bucket"
)

// FloorScripts returns section 6's floor scripts, holdfast's token
// bucket with source tbSrc and arguments tbArgs.
func FloorScripts(tbSrc string, tbArgs []string) []Script {
	return []Script{
		{Name: "empty", Does: "`return 1`: EVALSHA itself", Src: floorEmpty},
		{Name: "clock", Does: "TIME", Src: floorClock},
		{Name: floorFWName, Does: "INCRBY, then PEXPIRE (new window) or PTTL; 2 integers", Src: floorFixedWindow, Args: []string{"1", "1000"}},
		{Name: FloorTBName, Does: "TIME, GET, INCRBY; 1 integer", Src: floorTokenBucket, Args: []string{"1"}},
		{Name: floorHFName, Does: "the decision script of section 1's token bucket", Src: tbSrc, Args: tbArgs},
	}
}

type floorCell struct {
	Script string
	Hot    bool
}

type floorResult struct {
	Requests int
	Scripts  []Script
	Us       map[floorCell][]float64 // Redis's µs a call (usec_per_call)
	PerSec   map[floorCell][]float64 // redis-benchmark's requests per second
	Command  string                  // one run's command, for the record
}

// runFloor runs each floor script once per key set with redis-benchmark
// -c 1, after FLUSHALL and CONFIG RESETSTAT, so that usec_per_call is the
// script's alone.
func (h *harness) runFloor(ctx context.Context, res *floorResult, rep int) error {
	for _, hot := range h.cfg.keysets() {
		for _, s := range res.Scripts {
			sha, err := h.admin.ScriptLoad(ctx, s.Src).Result()
			if err != nil {
				return fmt.Errorf("floor %s: %w", s.Name, err)
			}
			if err := h.admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			if err := h.admin.ConfigResetStat(ctx).Err(); err != nil {
				return err
			}
			key := "hf:{floor:hot}"
			cmd := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(h.srv.Port()), "-n", strconv.Itoa(res.Requests), "-c", "1", "--csv"}
			if !hot {
				key = "hf:{floor:__rand_int__}"
				cmd = append(cmd, "-r", strconv.Itoa(h.cfg.CeilingRandom))
			}
			cmd = append(cmd, "EVALSHA", sha, "1", key)
			cmd = append(cmd, s.Args...)
			rps, err := redisBenchmark(ctx, cmd)
			if err != nil {
				return fmt.Errorf("floor %s: %w", s.Name, err)
			}
			us, err := scriptUsPerCall(ctx, h.admin)
			if err != nil {
				return err
			}
			if us <= 0 {
				return fmt.Errorf("floor %s: Redis counted no EVALSHA", s.Name)
			}
			c := floorCell{s.Name, hot}
			res.Us[c] = append(res.Us[c], us)
			res.PerSec[c] = append(res.PerSec[c], rps)
			if s.Name == floorHFName && hot {
				res.Command = "redis-benchmark " + strings.Join(cmd, " ")
			}
			h.progress("floor %-22s %-9s rep %d: %.2f µs a call, %.0f calls/s", s.Name, keysetName(hot), rep+1, us, rps)
		}
	}
	return nil
}

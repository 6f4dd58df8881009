// Command scriptcost counts the instructions Redis executes for one call
// of each of section 6's floor scripts and of holdfast's token-bucket
// decision script (with and without a call deadline), on a hot key and on
// 100k random keys: redis-server runs under valgrind's callgrind, one
// server per count, and redis-benchmark -c 1 sends n and then 3n calls;
// the difference of the two totals over 2n is a call's cost, the
// server's start and stop cancelling out. Unlike a time, the count does
// not depend on what else the machine runs, so it shows a script change
// of a few percent that timings on shared cores cannot.
//
//	cd bench && go run ./cmd/scriptcost [-n 1000]
//
// It needs valgrind, redis-server and redis-benchmark on PATH; each server
// it starts listens on a free 127.0.0.1 port, in its own temp dir, and is
// stopped by SHUTDOWN NOSAVE or, failing that, killed by PID.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/bench/harness"
	"github.com/holdfast/holdfast/bench/redisproc"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redisprobe"
)

func main() {
	n := flag.Int("n", 1000, "calls of the shorter run (the longer makes 3n)")
	rows := flag.String("rows", "", "comma-separated substrings: count only the rows whose names contain one")
	flag.Parse()
	if err := run(*n, *rows); err != nil {
		fmt.Fprintln(os.Stderr, "scriptcost:", err)
		os.Exit(1)
	}
}

func run(n int, rows string) error {
	for _, bin := range []string{"valgrind", "redis-server", "redis-benchmark"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s is not on PATH (Debian: apt-get install valgrind redis-server)", bin)
		}
	}
	pol, err := tokenbucket.Policy("tb", 1_000_000, 1_000_000)
	if err != nil {
		return err
	}
	args := tokenbucket.Algorithm.Args(pol, 1, "", 0)
	scripts := harness.FloorScripts(tokenbucket.Algorithm.Script().Source(), args)
	// The same decision with a call deadline an hour ahead (the
	// fallback layer's calls carry one): the guard reads TIME for it.
	deadline := driver.DeadlineArg(time.Now().Add(time.Hour).UnixMicro())
	scripts = append(scripts, harness.Script{Name: "holdfast token bucket, deadline", Does: "the same, with a call deadline", Src: tokenbucket.Algorithm.Script().Source(), Args: append(append([]string(nil), args...), deadline)})
	scripts = append(scripts, probes(scripts)...)
	var all []row
	for _, sc := range scripts {
		all = append(all, row{Script: sc, keys: 1})
	}
	all = append(all, several(pol)...)
	fmt.Printf("Instructions Redis executes a decision (callgrind Ir; (I(%d) - I(%d)) / %d, over the keys of a call that names several)\n\n", 3*n, n, 2*n)
	fmt.Println("| script | runs | hot key | 100k keys |")
	fmt.Println("| --- | --- | --: | --: |")
	for _, s := range all {
		if !selected(s.Name, rows) {
			continue
		}
		var cells []string
		for _, hot := range []bool{true, false} {
			a, err := count(s, hot, n)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			b, err := count(s, hot, 3*n)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			cells = append(cells, strconv.FormatInt((b-a)/int64(2*n*s.keys), 10))
		}
		fmt.Printf("| %s | %s | %s | %s |\n", s.Name, s.Does, cells[0], cells[1])
	}
	return nil
}

// probes are the token bucket floor changed one way at a time towards
// holdfast's decision: what each of its differences costs Redis.
func probes(scripts []harness.Script) []harness.Script {
	var floor harness.Script
	for _, s := range scripts {
		if s.Name == harness.FloorTBName {
			floor = s
		}
	}
	if floor.Src == "" || !strings.Contains(floor.Src, "\nreturn 1\n") || !strings.Contains(floor.Src, "redis.call('INCRBY', KEYS[1], ARGV[1])") {
		return nil // the floor changed: these edits no longer apply
	}
	three := []string{"1", "1000000", "1"}
	reply := func(r string) string { return strings.Replace(floor.Src, "\nreturn 1\n", "\nreturn "+r+"\n", 1) }
	return []harness.Script{
		{Name: "token bucket floor, 3 arguments", Does: "the floor with 3 ARGV, as holdfast's decision", Src: floor.Src, Args: three},
		{Name: "..., reply {1}", Does: "the 3-argument floor, replying {1}", Src: reply("{1}"), Args: three},
		{Name: "..., reply of 5 integers", Does: "the 3-argument floor, replying five integers", Src: reply("{1, 0, 0, 1000000, now}"), Args: three},
		{Name: "..., SET KEEPTTL", Does: "the 3-argument floor, writing SET KEEPTTL of a formatted E instead of INCRBY", Src: strings.Replace(floor.Src, "redis.call('INCRBY', KEYS[1], ARGV[1])", "redis.call('SET', KEYS[1], string.format('%d', now - 999999), 'KEEPTTL')", 1), Args: three},
	}
}

// several are the token bucket's decisions as pipeline.Decisions sends
// them besides the decision script: one decision in a call of its Many
// (a hot key's calls share one), and one decision on each of 8 keys in a
// call of its Many's Keys (decisions on distinct keys while the store is
// busy: goredis.StoreOptions.KeysDepth), counted a decision.
func several(pol core.Policy) []row {
	m := tokenbucket.Algorithm.Script().Many()
	args := tokenbucket.Algorithm.Args(pol, 1, "", 0)
	if m == nil || m.Keys == nil || !m.Fits(args) {
		return nil
	}
	one := m.AppendDecision(append([]string(nil), args[:m.Shared]...), args)
	keys := append([]string(nil), args[:m.Shared]...)
	for range 8 {
		keys = m.AppendDecision(append(keys, "1"), args)
	}
	return []row{
		{harness.Script{Name: "holdfast token bucket Many, 1 decision", Does: "one decision in a call of the Many (a hot key's shared calls)", Src: m.Script.Source(), Args: one}, 1},
		{harness.Script{Name: "holdfast token bucket Keys, 8 keys", Does: "a call of the Many's Keys with one decision on each of 8 keys, a decision", Src: m.Keys.Source(), Args: keys}, 8},
	}
}

// A row is a script cmd/scriptcost counts, and how many keys a call of it
// names: its count is per key, a decision each.
type row struct {
	harness.Script
	keys int
}

// selected reports whether row name is one of rows (comma-separated
// substrings; empty selects every row).
func selected(name, rows string) bool {
	if rows == "" {
		return true
	}
	for _, r := range strings.Split(rows, ",") {
		if r = strings.TrimSpace(r); r != "" && strings.Contains(name, r) {
			return true
		}
	}
	return false
}

// count starts redis-server under callgrind, sends calls calls of s with
// redis-benchmark -c 1, stops the server and returns the instructions it
// executed in all.
func count(s row, hot bool, calls int) (int64, error) {
	dir, err := os.MkdirTemp("", "scriptcost")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	port, err := redisproc.FreePort()
	if err != nil {
		return 0, err
	}
	out := filepath.Join(dir, "callgrind.out")
	srv := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+out,
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	srv.Stdout, srv.Stderr = nil, nil
	if err := srv.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.Process.Kill() // by PID: the process this call started
			<-done
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// Ready when the server answering is this one (redisprobe): another
	// server may have taken the port first. Valgrind runs redis-server in
	// its own process, so INFO's process_id is srv's PID.
	for i := 0; ; i++ {
		st := redisprobe.Probe(addr, nil, "", srv.Process.Pid)
		if st == redisprobe.Ready {
			break
		}
		if st == redisprobe.Foreign || st == redisprobe.Unverified {
			return 0, fmt.Errorf("another server answers on port %d", port)
		}
		if i == 300 {
			return 0, errors.New("redis-server under valgrind did not answer within 60 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	sha, err := rc.ScriptLoad(ctx, s.Src).Result()
	if err != nil {
		return 0, err
	}
	// One call first, outside the count: a script that answers an error
	// (bad arguments, a bad layout) would be counted as cheap.
	check := make([]string, s.keys)
	for i := range check {
		check[i] = "hf:{tb:check" + strconv.Itoa(i) + "}"
	}
	argv := make([]any, len(s.Args))
	for i, a := range s.Args {
		argv[i] = a
	}
	if err := rc.EvalSha(ctx, sha, check, argv...).Err(); err != nil {
		return 0, fmt.Errorf("a call of the script fails: %w", err)
	}
	key := "hf:{tb:hot}"
	cmd := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-n", strconv.Itoa(calls), "-c", "1", "--csv"}
	if !hot {
		key = "hf:{tb:__rand_int__}" // each occurrence a random key of its own
		cmd = append(cmd, "-r", "100000")
	}
	cmd = append(cmd, "EVALSHA", sha, strconv.Itoa(s.keys))
	for range s.keys {
		cmd = append(cmd, key)
	}
	cmd = append(cmd, s.Args...)
	if b, err := exec.CommandContext(ctx, "redis-benchmark", cmd...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("redis-benchmark: %v: %s", err, b)
	}
	_ = rc.Do(ctx, "SHUTDOWN", "NOSAVE").Err() // the connection closes: no reply
	select {
	case <-done:
		stopped = true
	case <-ctx.Done():
		return 0, errors.New("redis-server under valgrind did not stop")
	}
	return totals(out)
}

// totals reads the total instruction count of a callgrind output file.
func totals(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		for _, p := range []string{"summary: ", "totals: "} {
			if v, ok := strings.CutPrefix(line, p); ok {
				return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no summary line", path)
}

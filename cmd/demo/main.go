// Command demo shows holdfast's shared limit and its outage behaviour on a
// real redis-server: four limiters (as four app instances would, each with
// its own connection) share one token bucket while clients hammer them
// round-robin; midway Redis is killed and restarted.
//
// It starts redis-server from PATH on a free loopback port in a temp dir and
// stops it by PID. It exits non-zero when the instances together admitted
// more than the policy allows (plus the documented outage slack) or when a
// caller saw an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/fallback"
)

// quietRedis drops go-redis's own log lines: a dead Redis is the point here,
// and the breaker reports it once.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quietRedis{})
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type redisProc struct {
	cmd  *exec.Cmd
	port int
	dir  string
}

func startRedis(dir string, port int) (*redisProc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found on PATH: run `make deps` (as root) or `apt-get install redis-server`")
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &redisProc{cmd: cmd, port: port, dir: dir}
	for range 100 {
		if c, err := net.Dial("tcp", r.addr()); err == nil {
			c.Close()
			return r, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.kill()
	return nil, errors.New("redis-server did not start; see " + filepath.Join(dir, "redis.log"))
}

func (r *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisProc) kill() {
	r.cmd.Process.Signal(syscall.SIGKILL)
	r.cmd.Wait()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func run() error {
	instances := flag.Int("instances", 4, "limiters sharing the bucket")
	capacity := flag.Int64("capacity", 20, "bucket capacity")
	rate := flag.Float64("rate", 10, "refill per second")
	normal := flag.Duration("normal", 4*time.Second, "run time before Redis is killed")
	outage := flag.Duration("outage", 4*time.Second, "how long Redis stays down")
	after := flag.Duration("after", 4*time.Second, "run time after Redis returns")
	flag.Parse()

	dir, err := os.MkdirTemp("", "holdfast-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	port, err := freePort()
	if err != nil {
		return err
	}
	rds, err := startRedis(dir, port)
	if err != nil {
		return err
	}
	defer func() { rds.kill() }()

	policy, err := tokenbucket.Policy("demo", *capacity, *rate)
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lims := make([]*fallback.Limiter, *instances)
	for i := range lims {
		c, err := goredis.NewClient("redis://"+rds.addr()+"/0", goredis.ClientOptions{})
		if err != nil {
			return err
		}
		defer c.Close()
		l, err := fallback.New(goredis.New(c), fallback.Options{
			ID: fmt.Sprintf("app%d", i+1), Logger: quiet, Heartbeat: 250 * time.Millisecond,
			Breaker: fallback.BreakerOptions{ProbeInterval: 250 * time.Millisecond}, ExpectedInstances: *instances,
		})
		if err != nil {
			return err
		}
		if err := l.Start(context.Background()); err != nil {
			return err
		}
		defer l.Close()
		lims[i] = l
	}
	time.Sleep(300 * time.Millisecond)

	fmt.Printf("holdfast demo: %d instances share %v (capacity %d, %.0f/s); clients send ~800 req/s round-robin\n",
		*instances, policy, *capacity, tokenbucket.Rate(policy))
	fmt.Printf("redis-server pid %d on %s; killed after %v, restarted after %v more\n\n", rds.cmd.Process.Pid, rds.addr(), *normal, *outage)
	fmt.Printf("%4s  %-8s", "sec", "redis")
	for i := range lims {
		fmt.Printf("  %-16s", fmt.Sprintf("app%d adm/den/mode", i+1))
	}
	fmt.Printf("  %6s  %s\n", "total", "allowance")

	total := *normal + *outage + *after
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var redisUp atomic.Bool
	redisUp.Store(true)
	go func() {
		time.Sleep(*normal)
		rds.kill()
		redisUp.Store(false)
		time.Sleep(*outage)
		if r, err := startRedis(dir, port); err == nil {
			rds = r
			redisUp.Store(true)
		}
	}()

	type counts struct{ adm, den, errs atomic.Int64 }
	per := make([]counts, len(lims))
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) % int64(len(lims)))
				r, err := lims[i].Allow(context.Background(), policy, "client-1")
				switch {
				case err != nil:
					per[i].errs.Add(1)
				case r.Allowed:
					per[i].adm.Add(1)
				default:
					per[i].den.Add(1)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	start := time.Now()
	var admitted, errs int64
	prev := make([][2]int64, len(lims))
	for sec := 1; ctx.Err() == nil; sec++ {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(time.Duration(sec) * time.Second))):
		}
		if ctx.Err() != nil && time.Since(start) < time.Duration(sec)*time.Second {
			break
		}
		state := "up"
		if !redisUp.Load() {
			state = "DOWN"
		}
		fmt.Printf("%4d  %-8s", sec, state)
		var sum int64
		for i, l := range lims {
			a, d := per[i].adm.Load(), per[i].den.Load()
			fmt.Printf("  %3d/%4d %-7s", a-prev[i][0], d-prev[i][1], l.Status().Breaker)
			sum += a - prev[i][0]
			prev[i] = [2]int64{a, d}
		}
		admitted += sum
		fmt.Printf("  %6d  %.0f\n", sum, *rate)
	}
	wg.Wait()
	for i := range per {
		errs += per[i].errs.Load()
	}
	elapsed := time.Since(start)
	bound := float64(*capacity) + *rate*elapsed.Seconds()
	slack := 1.05
	fmt.Printf("\nadmitted %d in %.1fs; the policy allows %.0f (capacity %d + %.0f/s × %.1fs): %.1f%%; errors seen by callers: %d\n",
		admitted, elapsed.Seconds(), bound, *capacity, *rate, elapsed.Seconds(), 100*float64(admitted)/bound, errs)
	for _, l := range lims {
		st := l.Status()
		fmt.Printf("  %s: breaker %s, reconciles %d, pending log %d\n", st.ID, st.Breaker, st.Reconciles, st.PendingLog)
	}
	if errs > 0 {
		return fmt.Errorf("%d errors reached callers", errs)
	}
	if float64(admitted) > bound*slack {
		return fmt.Errorf("invariant broken: admitted %d > %.0f × %.2f", admitted, bound, slack)
	}
	fmt.Println("invariants held: the four instances together stayed within the one shared limit, through the outage.")
	return nil
}

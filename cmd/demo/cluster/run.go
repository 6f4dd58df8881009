package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// cluster is the running processes of one demo.
type cluster struct {
	o         Options
	work      string
	redis     *redisServer   // the redis-server; nil with --redis-cluster
	nodes     []*redisServer // the Redis Cluster's nodes with --redis-cluster
	masters   []Master       // the cluster's slot map, read at start
	instances []*proc
	ids       []string
	urls      []string // each instance's base URL
	nginx     *proc
	front     string // nginx's base URL
	stopOnce  sync.Once
}

// startCluster starts Redis, the instances and nginx. On error the
// returned cluster, if not nil, holds what did start.
func startCluster(ctx context.Context, o Options, work string, stderr io.Writer) (*cluster, error) {
	redisBin, err := findBinary("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	nginxBin, err := findBinary("nginx", "nginx")
	if err != nil {
		return nil, err
	}
	cliBin := ""
	if o.RedisCluster {
		if cliBin, err = findBinary("redis-cli", "redis-tools"); err != nil {
			return nil, err
		}
	}
	serveCmd := o.Serve
	if serveCmd == nil {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		serveCmd = []string{self, "serve"}
	}
	cfgPath := filepath.Join(work, "demo.yaml")
	if err := os.WriteFile(cfgPath, []byte(demoConfig), 0o644); err != nil {
		return nil, err
	}
	c := &cluster{o: o, work: work}
	if o.RedisCluster {
		if err := c.startRedisCluster(ctx, redisBin, cliBin); err != nil {
			return c, err
		}
		for i, n := range c.nodes {
			fmt.Fprintf(stderr, "redis cluster master %d pid %d on %s, slots %s (AOF, fsync always)\n", i+1, n.p.pid(), n.addr(), c.slotsOf(n.addr()))
		}
	} else {
		if err := c.startRedis(ctx, redisBin); err != nil {
			return c, err
		}
		fmt.Fprintf(stderr, "redis-server pid %d on %s (AOF, fsync always)\n", c.redis.p.pid(), c.redis.addr())
	}
	if err := c.startInstances(ctx, serveCmd, cfgPath); err != nil {
		return c, err
	}
	fmt.Fprintf(stderr, "%d instances ready: %v\n", len(c.instances), c.urls)
	if err := c.startFront(ctx, nginxBin); err != nil {
		return c, err
	}
	fmt.Fprintf(stderr, "nginx pid %d on %s, round-robin over the instances\n", c.nginx.pid(), c.front)
	return c, nil
}

// startRedis starts redis-server on a free port, trying another port if
// the first was taken meanwhile.
func (c *cluster) startRedis(ctx context.Context, bin string) error {
	c.redis = &redisServer{bin: bin, dir: filepath.Join(c.work, "redis")}
	if err := os.Mkdir(c.redis.dir, 0o755); err != nil {
		return err
	}
	var err error
	for attempt := 0; ; attempt++ {
		if c.redis.port, err = freePort(); err != nil {
			return err
		}
		if err = c.redis.start(ctx); err == nil || attempt == 2 || ctx.Err() != nil {
			return err
		}
	}
}

// startInstances starts every serve instance and waits until each is ready.
func (c *cluster) startInstances(ctx context.Context, serveCmd []string, cfgPath string) error {
	for i := range c.o.Instances {
		if err := c.startInstance(serveCmd, cfgPath, i); err != nil {
			return err
		}
	}
	hc := &http.Client{Timeout: 300 * time.Millisecond}
	for i, p := range c.instances {
		if err := waitFor(ctx, p, 10*time.Second, func() bool { return httpOK(hc, c.urls[i]+"/readyz") }); err != nil {
			return fmt.Errorf("instance %s: %w (see %s)", c.ids[i], err, filepath.Join(c.work, c.ids[i]+".log"))
		}
	}
	return nil
}

// startFront starts nginx on a free port in front of the instances.
func (c *cluster) startFront(ctx context.Context, bin string) error {
	dir := filepath.Join(c.work, "nginx")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	var ups []string
	for _, u := range c.urls {
		ups = append(ups, strings.TrimPrefix(u, "http://"))
	}
	if c.nginx, err = startNginx(ctx, bin, dir, loopback(port), ups); err != nil {
		return err
	}
	c.front = "http://" + loopback(port)
	return nil
}

// startInstance starts instance i with serve's flags.
func (c *cluster) startInstance(serveCmd []string, cfgPath string, i int) error {
	id := "app" + strconv.Itoa(i+1)
	port, err := freePort()
	if err != nil {
		return err
	}
	state := filepath.Join(c.work, id)
	if err := os.Mkdir(state, 0o755); err != nil {
		return err
	}
	args := append(serveCmd[1:len(serveCmd):len(serveCmd)],
		"--listen", loopback(port),
		"--redis", c.redisURL(),
		"--backend", c.o.Backend,
		"--id", id,
		"--config", cfgPath,
		"--state-dir", state,
		"--expected-instances", strconv.Itoa(c.o.Instances),
		"--call-timeout", c.o.CallTimeout.String(),
		"--probe-interval", c.o.ProbeInterval.String(),
		"--heartbeat", c.o.Heartbeat.String(),
	)
	p, err := startProc(id, filepath.Join(c.work, id+".log"), syscall.SIGKILL, serveCmd[0], args...)
	if err != nil {
		return err
	}
	c.instances = append(c.instances, p)
	c.ids = append(c.ids, id)
	c.urls = append(c.urls, "http://"+loopback(port))
	return nil
}

// stop stops nginx, then the instances (SIGTERM: each shuts down gracefully
// and saves its outage log), then Redis, each by PID. It may be called more
// than once.
func (c *cluster) stop() {
	c.stopOnce.Do(func() {
		c.nginx.stop(syscall.SIGTERM, 3*time.Second)
		var wg sync.WaitGroup
		for _, p := range c.instances {
			wg.Go(func() { p.stop(syscall.SIGTERM, 5*time.Second) })
		}
		wg.Wait()
		for _, r := range append([]*redisServer{c.redis}, c.nodes...) {
			if r != nil && r.p != nil {
				if r.frozen { // a run cut short during --fault stop
					r.p.cmd.Process.Signal(syscall.SIGCONT)
				}
				wg.Go(func() { r.p.stop(syscall.SIGTERM, 3*time.Second) })
			}
		}
		wg.Wait()
	})
}

// run drives the load and the outage and returns what was measured.
func (c *cluster) run(ctx context.Context, stderr io.Writer) (*Record, error) {
	o := c.o
	total := o.Normal + o.Outage + o.After
	rec := &Record{Backend: o.Backend, Fault: o.Fault, Duration: total, Routes: demoRoutes(), Instances: c.ids, KillAt: -1, RestartAt: -1}
	var clients []*client
	down := &atomic.Bool{}
	secs := rec.Seconds()
	for _, rt := range rec.Routes {
		for _, heavy := range []bool{true, false} {
			s := &Series{Route: rt.Name, Client: "gentle", Rate: o.GentleRate, Heavy: heavy}
			if heavy {
				s.Client, s.Rate = "heavy", o.HeavyRate
			}
			rec.Series = append(rec.Series, s)
			clients = append(clients, &client{series: s, url: c.front + rt.Path, c: newCounts(secs), down: down})
		}
	}
	if o.RedisCluster {
		cr, err := c.clusterRun(rec.Series)
		if err != nil {
			return nil, err
		}
		rec.Cluster = cr
	}
	var statusURLs []string
	for _, u := range c.urls {
		statusURLs = append(statusURLs, u+"/status")
	}
	start := time.Now()
	pl := newPoller(statusURLs, start, secs)
	pctx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() { pl.run(pctx); close(polled) }()
	defer func() { stopPoll(); <-polled }()

	loadDone := make(chan struct{})
	go func() { drive(ctx, clients, start, total); close(loadDone) }()
	prog := newProgress(stderr, start, total, clients, pl)
	progDone := make(chan struct{})
	go func() { prog.run(ctx, loadDone); close(progDone) }()
	chaosErr := c.chaos(ctx, start, rec, pl, prog, down)
	<-loadDone
	<-progDone
	if ctx.Err() != nil {
		return nil, errInterrupted
	}
	if chaosErr != nil {
		return nil, chaosErr
	}
	rec.RedisDown = make([]bool, secs)
	for s := range rec.RedisDown {
		from, to := time.Duration(s)*time.Second, time.Duration(s+1)*time.Second
		rec.RedisDown[s] = rec.KillAt >= 0 && from < rec.RestartAt && to > rec.KillAt
	}
	c.settle(ctx, pl, rec)
	stopPoll()
	<-polled
	pl.fill(rec)
	return rec, nil
}

// chaos applies the fault (--fault; kill by default) to Redis (with
// --redis-cluster, to the master of victimKey) after Normal and lifts it
// after Outage (kill: restarts it), recording when and setting down in
// between. It returns once the fault is lifted (or ctx ended).
func (c *cluster) chaos(ctx context.Context, start time.Time, rec *Record, pl *poller, prog *progress, down *atomic.Bool) error {
	sleepUntil := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Until(start.Add(d))):
			return true
		}
	}
	if !sleepUntil(c.o.Normal) {
		return nil
	}
	victim, what := c.redis, "redis-server"
	if rec.Cluster != nil {
		m := rec.Cluster.Masters[rec.Cluster.Killed]
		victim = c.node(m.Addr)
		what = fmt.Sprintf("redis cluster master %s (slots %s, tb heavy's key)", m.Addr, m.SlotsString())
	}
	pl.markKilled(ctx)
	lift, event, err := c.faultOn(ctx, victim)
	if err != nil {
		return fmt.Errorf("cluster: --fault %s on %s: %w", rec.fault().name, what, err)
	}
	down.Store(true)
	rec.KillAt = time.Since(start)
	pl.markDown()
	prog.event(what + " " + event)
	if !sleepUntil(c.o.Normal + c.o.Outage) {
		return nil // stop resumes a frozen server
	}
	event, err = lift()
	if err != nil {
		return fmt.Errorf("cluster: lift --fault %s from %s: %w", rec.fault().name, what, err)
	}
	rec.RestartAt = time.Since(start)
	down.Store(false)
	pl.markRestarted(rec.RestartAt)
	prog.event(what + " " + event)
	return nil
}

// slotsOf returns the slots of the master at addr, "" if it serves none.
func (c *cluster) slotsOf(addr string) string {
	for _, m := range c.masters {
		if m.Addr == addr {
			return m.SlotsString()
		}
	}
	return ""
}

// settle waits, up to Settle, for every instance to report a closed
// breaker and an empty outage log, and records their final status.
func (c *cluster) settle(ctx context.Context, pl *poller, rec *Record) {
	deadline := time.Now().Add(c.o.Settle)
	for {
		sts, ok := pl.statuses(ctx)
		rec.Final = rec.Final[:0]
		done := true
		for i, st := range sts {
			if ok[i] {
				rec.Final = append(rec.Final, st)
			}
			done = done && ok[i] && st.Breaker == "closed" && st.PendingLog == 0
		}
		if done || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

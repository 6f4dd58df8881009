// Package cluster is `holdfast-demo cluster`: it starts redis-server, N
// `holdfast-demo serve` instances (the running binary, executed again) and
// nginx round-robin in front, all on free loopback ports in one temp dir;
// drives a heavy client above its limit and a gentle one below it on a
// token bucket route and a sliding window route through nginx; kills Redis
// (SIGKILL) and restarts it on the same port and data (or, with --fault,
// freezes it, runs it out of memory or makes it a read-only replica, and
// lifts that); prints a
// per-second table; writes a report (SVG chart, HTML page, Markdown table);
// and checks the invariants of DESIGN.md, failing with their names when
// one broke.
//
// With --redis-cluster it starts a 3-master Redis Cluster (no replicas,
// cluster-require-full-coverage no) instead of one redis-server, and the
// outage kills only the master serving the heavy token-bucket client's key:
// the instances keep one breaker per shard, so that key goes to local
// leases while the other shards' keys keep deciding through Redis. The
// summary then names the killed master and counts each key's decisions by
// mode while it was down.
package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
)

// Options are the cluster command's settings, one per flag.
type Options struct {
	// Instances is how many serve instances run behind nginx.
	Instances int
	// Backend is the Redis client of the instances: goredis or rueidis.
	Backend string
	// RedisCluster runs a 3-master Redis Cluster instead of one
	// redis-server, and kills the master of the heavy token-bucket client's
	// key.
	RedisCluster bool
	// Normal, Outage and After are the three phases: load with Redis up,
	// Redis under the fault (killed, by default), load after the fault is
	// lifted (Redis restarted).
	Normal, Outage, After time.Duration
	// Fault is what the outage does to the redis-server: the name of one
	// of faults (fault.go: kill, stop, pause, oom, readonly, pauseall,
	// busy, noperm, noreplicas, wrongpass); "" means kill. With
	// RedisCluster, only kill.
	Fault string
	// Out is the report directory; "" makes a new one under the temp dir.
	Out string
	// HeavyRate and GentleRate are the clients' requests per second on each
	// route.
	HeavyRate, GentleRate float64
	// CallTimeout, ProbeInterval and Heartbeat are passed to every instance.
	CallTimeout, ProbeInterval, Heartbeat time.Duration
	// Settle bounds the wait, after the load, for every breaker to close and
	// every outage log to drain.
	Settle time.Duration
	// Keep keeps the work dir (config, logs, Redis data) after a successful
	// run; a failed run always keeps it.
	Keep bool
	// Serve is the command that starts one instance; nil means this binary
	// (os.Executable) with the argument "serve".
	Serve []string
}

// FlagSet returns the cluster command's flag set and the Options its Parse
// fills in.
func FlagSet(out io.Writer) (*flag.FlagSet, *Options) {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &Options{}
	fs.IntVar(&o.Instances, "instances", 4, "serve instances behind nginx")
	fs.StringVar(&o.Backend, "backend", "goredis", "Redis client of the instances: goredis or rueidis")
	fs.BoolVar(&o.RedisCluster, "redis-cluster", false,
		"run a 3-master Redis Cluster (no replicas) instead of one redis-server, and kill only the master of tb heavy's key")
	fs.DurationVar(&o.Normal, "normal", 10*time.Second, "load with Redis up before the kill")
	fs.DurationVar(&o.Outage, "outage", 10*time.Second, "how long Redis stays down (the fault lasts)")
	fs.StringVar(&o.Fault, "fault", "kill", faultUsage())
	fs.DurationVar(&o.After, "after", 10*time.Second, "load after Redis is back")
	fs.StringVar(&o.Out, "out", "", "report directory (default: a new holdfast-report-* directory in the temp dir)")
	fs.Float64Var(&o.HeavyRate, "heavy-rate", 50, "requests per second of the heavy client on each route")
	fs.Float64Var(&o.GentleRate, "gentle-rate", 2, "requests per second of the gentle client on each route")
	fs.DurationVar(&o.CallTimeout, "call-timeout", 100*time.Millisecond, "each instance's Redis call deadline")
	fs.DurationVar(&o.ProbeInterval, "probe-interval", 500*time.Millisecond, "each instance's probe period while Redis is down")
	fs.DurationVar(&o.Heartbeat, "heartbeat", 500*time.Millisecond, "each instance's membership heartbeat")
	fs.DurationVar(&o.Settle, "settle", 5*time.Second, "wait at most this long after the load for breakers to close")
	fs.BoolVar(&o.Keep, "keep", false, "keep the work dir (config, logs, Redis data)")
	return fs, o
}

// Validate reports the first bad option, naming its flag.
func (o *Options) Validate() error {
	switch {
	case o.Instances < 1 || o.Instances > 64:
		return fmt.Errorf("cluster: --instances %d: want 1..64", o.Instances)
	case o.Backend != "goredis" && o.Backend != "rueidis":
		return fmt.Errorf("cluster: --backend %q: want goredis or rueidis", o.Backend)
	case !validFault(o.Fault):
		return fmt.Errorf("cluster: --fault %q: want %s", o.Fault, faultNames())
	case o.RedisCluster && o.Fault != "" && o.Fault != "kill":
		return fmt.Errorf("cluster: --fault %s: with --redis-cluster only kill", o.Fault)
	case o.Normal <= 0 || o.Outage < 0 || o.After <= 0 || o.Normal+o.Outage+o.After > 10*time.Minute:
		return errors.New("cluster: --normal and --after must be positive, --outage not negative, and the run at most 10m")
	case o.HeavyRate <= 0 || o.HeavyRate > 1000 || o.GentleRate <= 0 || o.GentleRate > 1000:
		return errors.New("cluster: --heavy-rate and --gentle-rate must be in (0, 1000]")
	case o.CallTimeout <= 0 || o.ProbeInterval <= 0 || o.Heartbeat <= 0 || o.Settle < 0:
		return errors.New("cluster: --call-timeout, --probe-interval and --heartbeat must be positive")
	}
	return nil
}

// Main parses args and runs the cluster, printing the table and the
// summary to stdout and progress to stderr. It returns an error naming the
// broken invariants, if any.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := FlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("cluster: unexpected argument %q", fs.Arg(0))
	}
	if err := o.Validate(); err != nil {
		return err
	}
	return Run(ctx, *o, stdout, stderr)
}

// demoPrefix is demoConfig's key prefix.
const demoPrefix = "hf:"

// demoConfig is the policies the instances enforce: the README's example.
const demoConfig = `# Written by holdfast-demo cluster.
prefix: "` + demoPrefix + `"
policies:
  - name: tb
    path: /api/tb
    algorithm: token_bucket
    capacity: 20
    refill_per_second: 5
    key: header:X-Client-ID
  - name: sw
    path: /api/sw
    algorithm: sliding_window
    limit: 20
    window: 2s
    key: header:X-Client-ID
  - name: sc
    path: /api/sc
    algorithm: sliding_window_counter
    limit: 20
    window: 2s
    key: header:X-Client-ID
`

// demoRoutes returns the routes of demoConfig.
func demoRoutes() []Route {
	tb, err := tokenbucket.Policy("tb", 20, 5)
	if err != nil {
		panic(err)
	}
	sw, err := slidingwindow.Policy("sw", 20, 2*time.Second)
	if err != nil {
		panic(err)
	}
	sc, err := slidingcounter.Policy("sc", 20, 2*time.Second)
	if err != nil {
		panic(err)
	}
	return []Route{{Name: "tb", Path: "/api/tb", Policy: tb}, {Name: "sw", Path: "/api/sw", Policy: sw}, {Name: "sc", Path: "/api/sc", Policy: sc}}
}

// Run runs the cluster with o (already validated).
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) (err error) {
	work, err := os.MkdirTemp("", "holdfast-cluster-")
	if err != nil {
		return err
	}
	defer func() {
		if err == nil && !o.Keep {
			os.RemoveAll(work)
			return
		}
		fmt.Fprintf(stderr, "work dir kept (config, logs, Redis data): %s\n", work)
	}()
	out := o.Out
	if out == "" {
		if out, err = os.MkdirTemp("", "holdfast-report-"); err != nil {
			return err
		}
	}
	if out, err = filepath.Abs(out); err != nil {
		return err
	}

	c, err := startCluster(ctx, o, work, stderr)
	if c != nil {
		defer c.stop()
	}
	if err != nil {
		return err
	}
	rec, err := c.run(ctx, stderr)
	if err != nil {
		return err
	}
	c.stop()

	checks := Checks(rec)
	fmt.Fprintln(stdout)
	rec.WriteTable(stdout)
	fmt.Fprintln(stdout)
	for _, l := range rec.ClusterSummary() {
		fmt.Fprintln(stdout, l)
	}
	for _, ch := range checks {
		fmt.Fprintln(stdout, ch)
	}
	if err := WriteReport(out, rec, checks); err != nil {
		return fmt.Errorf("cluster: write report: %w", err)
	}
	fmt.Fprintf(stdout, "report: %s\n", filepath.Join(out, HTMLFile))
	fmt.Fprintf(stdout, "chart:  %s\n", filepath.Join(out, SVGFile))
	if broken := Broken(checks); len(broken) > 0 {
		return fmt.Errorf("invariant broken: %s", strings.Join(broken, "; "))
	}
	fmt.Fprintln(stdout, "invariants held")
	return nil
}

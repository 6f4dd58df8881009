package serve

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// Options are serve's settings: one field per flag. Each flag's default is
// taken from its environment variable when that is set (HOLDFAST_ and the
// flag's name in upper case with '_' for '-', e.g. HOLDFAST_STATE_DIR), so a
// container can be configured either way; a flag on the command line wins.
type Options struct {
	// Listen is the HTTP address, e.g. "127.0.0.1:8080" or ":8080".
	Listen string
	// Redis is the redis:// or rediss:// URL, with user and password if
	// needed, or a cluster's seed list (see the flag's help). It is never
	// logged or shown in full: the password is redacted.
	Redis string
	// RedisCluster forces a Redis Cluster client for a URL that names a
	// single seed node; a URL with addr= seeds is a cluster without it.
	RedisCluster bool
	// Backend is the Redis client: "goredis" or "rueidis".
	Backend string
	// ID names the instance in Redis's membership set, /status and logs.
	ID string
	// Service names the application whose instances share the quota:
	// instances of other services on the same Redis are not counted.
	Service string
	// Config is the path of the policies' YAML file.
	Config string
	// GRPCListen is the address of the Envoy rate limit service (RLS v3
	// gRPC, with the gRPC health service); "" serves none.
	GRPCListen string
	// AdminListen is the address of the operator's API (POST
	// /admin/reset, GET /admin/peek); "" serves none. It can unblock any
	// client: keep it on loopback or a private network.
	AdminListen string
	// RLSConfig is the rate limit service's descriptors: an
	// envoyproxy/ratelimit config file or a directory of them (see
	// package rls).
	RLSConfig string
	// StateDir is where the limiter writes an unreconciled outage log at
	// shutdown and reads it back at start; "" keeps it in memory only.
	StateDir string
	// ExpectedInstances is the instance count assumed until Redis's
	// membership set reports the real one.
	ExpectedInstances int
	// CallTimeout bounds every Redis call on the request path.
	CallTimeout time.Duration
	// ProbeInterval is how often an open breaker probes Redis.
	ProbeInterval time.Duration
	// Heartbeat is how often the instance refreshes its membership.
	Heartbeat time.Duration
	// ShutdownTimeout bounds the graceful shutdown of in-flight requests.
	ShutdownTimeout time.Duration
	// LogFormat is "text" or "json" (log/slog handlers, to stderr).
	LogFormat string

	envErrs map[string]error // unparsable environment variables by flag name
}

// FlagSet returns serve's flag set, writing its usage and errors to out,
// and the Options its Parse fills in. It is the one definition of the
// flags: the binary parses its arguments with it, and deploy's tests check
// docker-compose.yml's commands against it.
func FlagSet(out io.Writer) (*flag.FlagSet, *Options) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &Options{envErrs: map[string]error{}}
	envInt := func(name string, def int) int {
		v, ok := os.LookupEnv(EnvName(name))
		if !ok {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			o.envErrs[name] = fmt.Errorf("serve: %s=%q: want an integer", EnvName(name), v)
		}
		return n
	}
	envDuration := func(name string, def time.Duration) time.Duration {
		v, ok := os.LookupEnv(EnvName(name))
		if !ok {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			o.envErrs[name] = fmt.Errorf("serve: %s=%q: want a duration such as 50ms", EnvName(name), v)
		}
		return d
	}
	envBool := func(name string, def bool) bool {
		v, ok := os.LookupEnv(EnvName(name))
		if !ok {
			return def
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			o.envErrs[name] = fmt.Errorf("serve: %s=%q: want true or false", EnvName(name), v)
		}
		return b
	}
	fs.StringVar(&o.Listen, "listen", env("listen", "127.0.0.1:8080"), "HTTP listen address")
	fs.StringVar(&o.Redis, "redis", env("redis", "redis://127.0.0.1:6379/0"),
		"Redis URL: redis://[user:password@]host:port/db or rediss:// for TLS; a Redis Cluster as\n"+
			"redis://[user:password@]seed1:port?addr=seed2:port&addr=seed3:port.\n"+
			"Prefer the HOLDFAST_REDIS variable for a URL with a password: a flag shows in ps")
	fs.BoolVar(&o.RedisCluster, "redis-cluster", envBool("redis-cluster", false),
		"treat --redis as a Redis Cluster seed even when it names one node (a URL with addr= seeds is a cluster anyway)")
	fs.StringVar(&o.Backend, "backend", env("backend", "goredis"), "Redis client: goredis or rueidis")
	fs.StringVar(&o.ID, "id", env("id", ""), "instance name (default: with --state-dir the ID kept in the dir's instance slot, so a restart keeps it; else hostname-pid)")
	fs.StringVar(&o.Service, "service", env("service", ""),
		"service name: its instances share the quota and count each other; other services on the same Redis are not counted")
	fs.StringVar(&o.Config, "config", env("config", ""), "policies YAML file (required unless --rls-config is given)")
	fs.StringVar(&o.GRPCListen, "grpc-listen", env("grpc-listen", ""), "gRPC listen address of the Envoy rate limit service (RLS v3 and gRPC health); needs --rls-config")
	fs.StringVar(&o.AdminListen, "admin-listen", env("admin-listen", ""), "address of the operator's API (POST /admin/reset, GET /admin/peek: unblock or inspect a client; keep it on loopback); empty: none")
	fs.StringVar(&o.RLSConfig, "rls-config", env("rls-config", ""), "the rate limit service's descriptors: an envoyproxy/ratelimit YAML file or a directory of them, one domain a file")
	fs.StringVar(&o.StateDir, "state-dir", env("state-dir", ""), "directory for the outage log across restarts")
	fs.IntVar(&o.ExpectedInstances, "expected-instances", envInt("expected-instances", 1),
		"instances assumed until Redis's membership set says (matters when starting during an outage)")
	fs.DurationVar(&o.CallTimeout, "call-timeout", envDuration("call-timeout", 50*time.Millisecond), "deadline of each Redis call")
	fs.DurationVar(&o.ProbeInterval, "probe-interval", envDuration("probe-interval", time.Second), "health probe period while Redis is down")
	fs.DurationVar(&o.Heartbeat, "heartbeat", envDuration("heartbeat", time.Second), "membership heartbeat period")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", envDuration("shutdown-timeout", 10*time.Second), "graceful shutdown bound")
	fs.StringVar(&o.LogFormat, "log-format", env("log-format", "text"), "log format: text or json")
	return fs, o
}

// Parse parses serve's arguments with FlagSet and validates the result. A
// flag given on the command line overrides its environment variable, even
// one that does not parse.
func Parse(args []string, out io.Writer) (*Options, error) {
	fs, o := FlagSet(out)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { delete(o.envErrs, f.Name) })
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return o, nil
}

// Validate reports a bad option, naming its flag or variable.
func (o *Options) Validate() error {
	for _, err := range o.envErrs {
		return err
	}
	switch {
	case o.Listen == "":
		return errors.New("serve: --listen is empty")
	case o.Redis == "":
		return errors.New("serve: --redis is empty")
	case o.Backend != "goredis" && o.Backend != "rueidis":
		return fmt.Errorf("serve: --backend %q: want goredis or rueidis", o.Backend)
	case o.Config == "" && o.RLSConfig == "":
		return errors.New("serve: --config is required (the policies' YAML file), or --rls-config with --grpc-listen")
	case (o.GRPCListen == "") != (o.RLSConfig == ""):
		return errors.New("serve: --grpc-listen and --rls-config go together (the rate limit service and its descriptors)")
	case o.ExpectedInstances < 1:
		return fmt.Errorf("serve: --expected-instances %d: want at least 1", o.ExpectedInstances)
	case o.CallTimeout <= 0 || o.ProbeInterval <= 0 || o.Heartbeat <= 0 || o.ShutdownTimeout <= 0:
		return errors.New("serve: --call-timeout, --probe-interval, --heartbeat and --shutdown-timeout must be positive")
	case o.LogFormat != "text" && o.LogFormat != "json":
		return fmt.Errorf("serve: --log-format %q: want text or json", o.LogFormat)
	}
	return nil
}

// EnvName returns the environment variable that gives flag name its
// default: "state-dir" → "HOLDFAST_STATE_DIR".
func EnvName(name string) string {
	b := []byte("HOLDFAST_" + name)
	for i, c := range b {
		switch {
		case c == '-':
			b[i] = '_'
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(EnvName(name)); ok {
		return v
	}
	return def
}

// Package serve is `holdfast-demo serve`: one HTTP app instance whose
// routes are limited by the policies of a YAML config, shared with every
// other instance through Redis and kept limited locally while Redis is
// down.
//
// Routes: each policy's path (httplimit middleware around a handler that
// answers 200 JSON), GET /status (the limiter's state), /healthz (the
// process is alive), /readyz (started and config loaded) and /metrics
// (Prometheus). With --grpc-listen and --rls-config it is also Envoy's
// rate limit service (RLS v3 over gRPC, with gRPC health; see rls.go and
// docs/envoy.md), deciding on the same limiter.
//
// /readyz stays 200 while Redis is down. Every instance shares the one
// Redis, so an outage would take every instance out of the load balancer
// at once: failing readiness would turn a degraded limiter into a total
// outage, the very thing holdfast exists to avoid. The limiter keeps
// enforcing each instance's share of the quota, and /status and the
// breaker metrics tell operators about the outage. /readyz fails only
// before the limiter started and once shutdown began.
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/holdfast/holdfast/cmd/demo/serve/rls"
	"github.com/holdfast/holdfast/config"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/httplimit"
	"github.com/holdfast/holdfast/metrics"
)

// App is one serve instance: its config, limiter, metrics and routes.
type App struct {
	opts    Options
	cfg     *config.Config
	lim     *fallback.Limiter
	metrics *metrics.Metrics
	log     *slog.Logger
	closeDB func()
	handler http.Handler
	ready   atomic.Bool

	rls    *rlsService    // the Envoy rate limit service, with --rls-config
	grpc   *grpc.Server   // its server
	health *health.Server // and its gRPC health service
}

// Status is the body of GET /status: the limiter's state (id, breaker,
// instances, pending_log, reconciles, last_reconcile_ns and, on Redis
// Cluster, shards: each shard's slots, breaker, instances and pending_log)
// and the backend.
// It never holds the Redis URL.
type Status struct {
	fallback.Status
	// Backend is the Redis client in use.
	Backend string `json:"backend"`
	// Ready is what /readyz answers.
	Ready bool `json:"ready"`
	// RLSDomains are the rate limit service's domains (--rls-config).
	RLSDomains []string `json:"rls_domains,omitempty"`
}

// New loads the config, builds the store and the limiter and starts the
// limiter's background work, which runs until ctx is done or Close (it
// does not need Redis up: an instance started during an outage limits
// locally). A config error names the policy and the field. Close releases
// what New built.
func New(ctx context.Context, o Options, log *slog.Logger) (*App, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	cfg := &config.Config{}
	if o.Config != "" {
		var err error
		cfg, err = config.LoadFile(o.Config)
		if err == nil {
			err = checkRoutes(cfg)
		}
		if err != nil {
			return nil, fmt.Errorf("serve: %s: %w", o.Config, err)
		}
	}
	modes := cfg.OutageModes()
	var rc *rls.Config
	if o.RLSConfig != "" {
		var err error
		if rc, err = rls.LoadPath(o.RLSConfig); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		for name, m := range rc.OutageModes() {
			if _, dup := modes[name]; dup {
				return nil, fmt.Errorf("serve: policy %q of --config is also a descriptor's policy name in --rls-config: rename it", name)
			}
			modes[name] = m
		}
	}
	store, closeDB, err := openStore(ctx, &o, log)
	if err != nil {
		return nil, err
	}
	a := &App{opts: o, cfg: cfg, metrics: metrics.New(), log: log, closeDB: closeDB}
	a.lim, err = fallback.New(a.metrics.Store(store), fallback.Options{
		ID:                o.ID,
		Service:           o.Service,
		Prefix:            cfg.Prefix,
		ExpectedInstances: o.ExpectedInstances,
		Heartbeat:         o.Heartbeat,
		OutageModes:       modes,
		StateDir:          o.StateDir,
		Logger:            log,
		Breaker: fallback.BreakerOptions{
			CallTimeout:   o.CallTimeout,
			ProbeInterval: o.ProbeInterval,
			OnStateChange: a.metrics.BreakerChange,
		},
	})
	if err != nil {
		closeDB()
		return nil, fmt.Errorf("serve: %w", err)
	}
	a.metrics.Watch(a.lim.Status)
	if rc != nil {
		a.newRLS(rc)
	}
	a.handler = a.routes()
	if err := a.lim.Start(ctx); err != nil {
		a.lim.Close()
		closeDB()
		return nil, fmt.Errorf("serve: start limiter: %w", err)
	}
	a.ready.Store(true)
	return a, nil
}

// Handler returns the instance's routes.
func (a *App) Handler() http.Handler { return a.handler }

// Limiter returns the instance's limiter.
func (a *App) Limiter() *fallback.Limiter { return a.lim }

// Status returns what GET /status shows.
func (a *App) Status() Status {
	st := Status{Status: a.lim.Status(), Backend: a.opts.Backend, Ready: a.ready.Load()}
	if a.rls != nil {
		st.RLSDomains = a.rls.cfg.Domains()
	}
	return st
}

// Close marks the instance not ready, stops the rate limit service, closes
// the limiter (which writes an unreconciled outage log to the state dir)
// and then the Redis client.
func (a *App) Close() error {
	a.ready.Store(false)
	if a.grpc != nil {
		a.grpc.Stop() // no decision after the limiter closes
	}
	err := a.lim.Close()
	a.closeDB()
	return err
}

// checkRoutes requires what the config leaves optional and serve needs:
// every policy names its route (path) and its key source (key).
func checkRoutes(cfg *config.Config) error {
	for i, p := range cfg.Policies {
		field := ""
		switch {
		case p.Path == "":
			field = "path"
		case p.Key.IsZero():
			field = "key"
		default:
			continue
		}
		return &config.FieldError{Policy: p.Name, Index: i, Field: field, Msg: "required by serve, which routes each policy's path and keys it by the config"}
	}
	return nil
}

func (a *App) routes() http.Handler {
	mux := http.NewServeMux()
	limited := a.metrics.Limiter(a.lim)
	ok := http.HandlerFunc(httplimit.AllowedJSON)
	for _, rt := range a.cfg.Routes() {
		// Policies sharing a path are charged together, all or nothing.
		mux.Handle(rt.Path, httplimit.New(limited, rt.Rule, httplimit.WithLogger(a.log))(ok))
	}
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(a.Status())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", a.metrics.Handler())
	return mux
}

// Run is the serve command: it starts the App, listens on o.Listen and
// serves until ctx is done (the caller cancels it on SIGTERM or SIGINT),
// then shuts down gracefully: readiness fails, in-flight requests finish
// (bounded by ShutdownTimeout), and the limiter closes, saving its outage
// log to the state dir.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	// The limiter's background work outlives ctx: Close stops it after the
	// last in-flight request.
	a, err := New(context.WithoutCancel(ctx), o, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		a.Close()
		return fmt.Errorf("serve: %w", err)
	}
	var gln net.Listener
	if a.grpc != nil {
		if gln, err = net.Listen("tcp", o.GRPCListen); err != nil {
			ln.Close()
			a.Close()
			return fmt.Errorf("serve: --grpc-listen: %w", err)
		}
	}
	var aln net.Listener
	if o.AdminListen != "" {
		if aln, err = net.Listen("tcp", o.AdminListen); err != nil {
			ln.Close()
			if gln != nil {
				gln.Close()
			}
			a.Close()
			return fmt.Errorf("serve: --admin-listen: %w", err)
		}
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	var admin *http.Server
	if aln != nil {
		admin = &http.Server{Handler: a.AdminHandler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: srv.ErrorLog}
		log.Info("holdfast serve admin listening", "addr", aln.Addr().String())
		go func() { _ = admin.Serve(aln) }()
		defer admin.Close()
	}
	log.Info("holdfast serve listening", "addr", ln.Addr().String(), "id", a.lim.Status().ID, "backend", o.Backend,
		"redis", Redact(o.Redis), "policies", len(a.cfg.Policies), "state_dir", o.StateDir)
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	if gln != nil {
		log.Info("holdfast serve grpc listening", "addr", gln.Addr().String(), "domains", strings.Join(a.rls.cfg.Domains(), ","))
		go func() { served <- a.grpc.Serve(gln) }()
	}
	select {
	case err = <-served: // a listener failed
		if a.grpc != nil {
			a.grpc.Stop()
		}
		srv.Close()
	case <-ctx.Done():
		log.Info("holdfast serve shutting down", "id", a.lim.Status().ID)
		a.ready.Store(false)
		sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
		stopped := make(chan struct{})
		if a.grpc != nil {
			a.health.Shutdown() // NOT_SERVING: Envoy's health checks move on
			go func() { a.grpc.GracefulStop(); close(stopped) }()
		} else {
			close(stopped)
		}
		err = srv.Shutdown(sctx)
		select {
		case <-stopped:
		case <-sctx.Done():
			a.grpc.Stop() // in-flight calls past the bound end
		}
		cancel()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	st := a.lim.Status()
	if cerr := a.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("serve: close limiter: %w", cerr))
	}
	log.Info("holdfast serve stopped", "id", st.ID, "breaker", st.Breaker, "pending_log", st.PendingLog)
	return err
}

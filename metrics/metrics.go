// Package metrics exports a holdfast limiter's behaviour to Prometheus:
// decisions by policy, result and mode; the circuit breaker's state and
// transitions; the latency of every Redis call; the outage log's size; and
// reconciliations.
//
// Labels hold only bounded, non-secret values: policy names from the
// config, script names, breaker states. A client key never becomes a label
// (each key would be a new time series, and keys are client data), and no
// Redis address or credential is exported.
//
// Wire it up in three places: wrap the store (Store) before handing it to
// fallback.New, pass BreakerChange as the breaker's OnStateChange, and wrap
// the limiter (Limiter) that the HTTP middleware calls; then Watch the
// limiter's Status and serve Handler.
package metrics

import (
	"context"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// Namespace starts every metric name.
const Namespace = "holdfast"

// Metrics is one instance's set of collectors, in a registry of its own
// (with the Go runtime and process collectors), so two instances in one
// process, as in tests, do not collide. It is safe for concurrent use.
type Metrics struct {
	reg         *prometheus.Registry
	decisions   *prometheus.CounterVec
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	calls       *prometheus.HistogramVec
	storeErrs   *prometheus.CounterVec

	watchOnce sync.Once
}

// breakerStates are the values of the state label, in fallback.State order.
var breakerStates = []fallback.State{fallback.Closed, fallback.Open, fallback.Reconciling}

// New returns a Metrics with every collector registered; the breaker state
// gauge starts at closed, a Breaker's default start.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "decisions_total",
			Help: "Rate-limit decisions by policy, result (allowed, denied, error) and mode (redis, local, fail_open, fail_closed; none on error).",
		}, []string{"policy", "result", "mode"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "breaker_state",
			Help: "1 for the circuit breaker's current state (closed, open, reconciling), 0 for the others.",
		}, []string{"state"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "breaker_transitions_total",
			Help: "Circuit breaker state changes by from and to state.",
		}, []string{"from", "to"}),
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "redis_call_duration_seconds",
			Help: "Duration of calls to Redis by script (ping, pipeline and commands for those calls) and outcome (ok, error).",
			// 100µs to about 200ms: the call deadline is tens of milliseconds.
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 12),
		}, []string{"script", "outcome"}),
	}
	m.storeErrs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "store_errors_total",
		Help: "Failed store calls by class (request, unavailable, unknown) and reason (a Redis error code such as OOM, READONLY or NOPERM; network, deadline, malformed, unknown; other for a reason outside that set). See docs/errors.md.",
	}, []string{"class", "reason"})
	m.reg.MustRegister(m.decisions, m.state, m.transitions, m.calls, m.storeErrs,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.setState(fallback.Closed)
	return m
}

// storeError counts a failed store call by its class and reason.
func (m *Metrics) storeError(err error) {
	reason := core.ReasonOf(err)
	if !pipeline.KnownReason(reason) {
		reason = "other"
	}
	m.storeErrs.WithLabelValues(core.ClassOf(err).String(), reason).Inc()
}

// Registry returns the registry the collectors live in, for tests and for
// adding an application's own collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// BreakerChange records a breaker transition: it counts it and moves the
// state gauge. Its signature is fallback.BreakerOptions.OnStateChange's.
func (m *Metrics) BreakerChange(from, to fallback.State) {
	m.transitions.WithLabelValues(from.String(), to.String()).Inc()
	m.setState(to)
}

func (m *Metrics) setState(s fallback.State) {
	for _, st := range breakerStates {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(st.String()).Set(v)
	}
}

// Watch registers gauges read from status at every scrape: the outage log's
// pending grants, the live instance count, AllowAll's pending and lost
// refunds, the reconcile count, the restored known states and the last
// reconciliation's duration. Only the first call registers; status must be
// cheap and safe for concurrent use (fallback.Limiter.Status is).
func (m *Metrics) Watch(status func() fallback.Status) {
	m.watchOnce.Do(func() {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: Namespace, Name: "pending_log_grants",
				Help: "Outage log entries (local grants; a token bucket key's grants within a millisecond are one) that Redis has not acknowledged yet.",
			}, func() float64 { return float64(status().PendingLog) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: Namespace, Name: "instances",
				Help: "Live instance count this instance divides the quota by during an outage.",
			}, func() float64 { return float64(status().Instances) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: Namespace, Name: "pending_refunds",
				Help: "AllowAll refunds the breaker kept from Redis, applied when it returns.",
			}, func() float64 { return float64(status().PendingRefunds) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: Namespace, Name: "lost_refunds_total",
				Help: "AllowAll refunds that failed in Redis or were dropped: each leaves its charge spent (an under-admission).",
			}, func() float64 { return float64(status().LostRefunds) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: Namespace, Name: "reconciles_total",
				Help: "Replays of the outage log into Redis.",
			}, func() float64 { return float64(status().Reconciles) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: Namespace, Name: "restored_keys_total",
				Help: "Known states written back after Redis lost its data (restarted empty, flushed, failed over to a copy without it).",
			}, func() float64 { return float64(status().RestoredKeys) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: Namespace, Name: "last_reconcile_duration_seconds",
				Help: "Duration of the last replay of the outage log.",
			}, func() float64 { return status().LastRecon.Seconds() }),
		)
	})
}

// A Decider decides one request: core.Decider, which core.Limiter and
// fallback.Limiter implement.
type Decider = core.Decider

// Limiter returns d counting each decision by policy, result and mode. The
// key is never recorded. When d is a core.MultiDecider so is the Limiter:
// an AllowAll counts one decision per policy, each with its own result,
// except that a policy admitted but not spent because another denied
// counts as "denied".
func (m *Metrics) Limiter(d Decider) Decider {
	if md, ok := d.(core.MultiDecider); ok {
		return &multiDecider{decider{next: d, m: m}, md}
	}
	return &decider{next: d, m: m}
}

type decider struct {
	next Decider
	m    *Metrics
}

func (d *decider) AllowN(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error) {
	res, err := d.next.AllowN(ctx, p, key, cost)
	d.count(p, res.Allowed, res.Mode, err)
	return res, err
}

func (d *decider) count(p core.Policy, allowed bool, mode core.Mode, err error) {
	result, m := "denied", mode.String()
	switch {
	case err != nil:
		result, m = "error", "none"
	case allowed:
		result = "allowed"
	}
	d.m.decisions.WithLabelValues(p.Name(), result, m).Inc()
}

type multiDecider struct {
	decider
	multi core.MultiDecider
}

func (d *multiDecider) AllowAll(ctx context.Context, reqs ...core.Request) ([]core.Result, error) {
	rs, err := d.multi.AllowAll(ctx, reqs...)
	all := err == nil && core.AllAllowed(rs)
	for i, q := range reqs {
		var mode core.Mode
		if i < len(rs) {
			mode = rs[i].Mode
		}
		d.count(q.Policy, all, mode, err)
	}
	return rs, err
}

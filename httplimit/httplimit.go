// Package httplimit is net/http middleware that rate-limits a route with a
// holdfast limiter:
//
//	rule := httplimit.Rule{Policy: policy, Key: httplimit.Header("X-Client-ID")}
//	mux.Handle("/api", httplimit.New(limiter, rule)(handler))
//
// A Rule says what limits a route: the policy, whose quota a request
// spends (a KeyFunc: Header, Cookie, Query, ClientIP or your own, such as a
// token's subject), what it costs, which requests are exempt, and what a
// store failure does. Options say how the middleware answers: custom deny
// and error handlers, X-RateLimit-* fields, the logger.
//
// Every decided request, admitted or not, carries the RateLimit-Policy and
// RateLimit header fields of draft-ietf-httpapi-ratelimit-headers-11:
//
//	RateLimit-Policy: "tb";q=20;w=4   (quota; window in seconds)
//	RateLimit: "tb";r=5;t=3           (remaining; effective window in seconds)
//
// An admitted request reaches the next handler, which can read the decision
// with FromContext; a denied one gets 429 Too Many Requests with
// Retry-After and a JSON Body. A request without a client key gets 400.
//
// A store error never becomes a 500. A *fallback.Limiter decides through
// an outage itself (leases, fail_open or fail_closed) and returns no store
// errors but a key that holds the wrong type; every store error that
// reaches the middleware, from a *core.Limiter or that one, is decided by
// the Rule's Outage: FailOpen (the default) admits the request, FailClosed
// denies it, and either is logged. Only the server's own errors are a 500:
// a KeyFunc's or cost function's failure, or a cost below 1.
package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/core"
)

// Limiter decides requests: core.Decider, which *core.Limiter and
// *fallback.Limiter implement.
type Limiter = core.Decider

var _ Limiter = (*core.Limiter)(nil)

// Rule is what a route is limited by. Policy and Key are required; the zero
// value of every other field is its documented default.
type Rule struct {
	// Policy is the limit, e.g. from config.Policy.Policy.
	Policy core.Policy
	// Key finds the client key of a request. See KeyFunc.
	Key KeyFunc
	// Cost is what a request spends; nil means 1. A cost above the
	// policy's limit could never be admitted: the request is refused with
	// a *ClientError (400). A cost below 1 is the server's error (500).
	// An error refuses the request as a KeyFunc's does.
	Cost func(r *http.Request) (int64, error)
	// Exempt, when it reports true, passes the request to the next
	// handler without limiting it: no key, no spend, no header fields.
	// nil exempts nothing.
	Exempt func(r *http.Request) bool
	// Outage decides a request whose limiter returned a store error; the
	// zero value is FailOpen.
	Outage Outage
	// Also are further policies charged with Policy, for the same key and
	// cost, all or nothing (core.MultiDecider.AllowAll): a request is
	// admitted only if every policy admits it, and one denied by any
	// spends none of the others. The limiter must be a core.MultiDecider.
	// The header fields list every policy; Retry-After and FromContext
	// give the first denying policy's decision, or on admission the
	// decision with the least remaining.
	Also []core.Policy
}

// Outage is what the middleware does with a request its limiter could not
// decide because the store failed.
type Outage int

const (
	// FailOpen (the default) admits the request, as Envoy's and Kong's
	// limiters do by default: a limiter outage must not become an API
	// outage. The decision is {Allowed, Remaining: Limit, Mode:
	// fail_open}.
	FailOpen Outage = iota
	// FailClosed denies the request with 429 and Retry-After: 1, for
	// routes such as logins where a burst is worse than an outage.
	FailClosed
)

// String returns "fail_open" or "fail_closed".
func (o Outage) String() string {
	if o == FailClosed {
		return "fail_closed"
	}
	return "fail_open"
}

// An Option configures New.
type Option func(*options)

type options struct {
	logger  *slog.Logger
	deny    func(http.ResponseWriter, *http.Request, core.Result)
	onError func(http.ResponseWriter, *http.Request, error)
	xstyle  xStyle
	now     func() time.Time
}

// WithLogger sets where the middleware reports what it could not decide;
// nil or absent means slog.Default(). A store error is logged at Warn (at
// Error for a key that holds the wrong type, which will not heal), a rule
// the limiter rejects or a KeyFunc's own failure at Error, each with the
// policy and path. Each kind is logged at most once a second, with the
// number of lines left out since the last ("suppressed"), so an outage
// does not log every request. Client errors and cancelled requests are not
// logged, and the middleware never logs a client key.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithClock sets the middleware's clock, which spaces log lines and gives
// WithXRateLimitUnix its time; nil or absent means time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithDenyHandler makes f answer denied requests instead of the default
// 429 with a JSON Body. When f runs, the RateLimit fields, Retry-After and
// any X-RateLimit fields are set, and r's context carries the decision
// (FromContext); f writes the status and the body.
func WithDenyHandler(f func(w http.ResponseWriter, r *http.Request, res core.Result)) Option {
	return func(o *options) { o.deny = f }
}

// WithErrorHandler makes f answer requests the middleware could not decide
// instead of the default, which answers a *ClientError with 400 and its
// Reason, a request whose context ended with 503, and anything else with
// 500 and a body that reveals neither the error nor the key. Store errors
// never reach f: the Rule's Outage decides them.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(o *options) { o.onError = f }
}

// New returns middleware that admits each request through l under rule,
// and passes admitted requests to the next handler. It panics if l or
// rule.Key is nil or rule.Policy is the zero Policy, like http.Handle with
// a nil handler.
func New(l Limiter, rule Rule, opts ...Option) func(http.Handler) http.Handler {
	switch {
	case l == nil:
		panic("httplimit: nil Limiter")
	case rule.Key == nil:
		panic("httplimit: Rule.Key is nil")
	case !rule.Policy.Valid():
		panic("httplimit: Rule.Policy is the zero Policy")
	}
	var multi core.MultiDecider
	if len(rule.Also) > 0 {
		md, ok := l.(core.MultiDecider)
		if !ok {
			panic("httplimit: Rule.Also needs a Limiter that is a core.MultiDecider")
		}
		for _, p := range rule.Also {
			if !p.Valid() {
				panic("httplimit: Rule.Also holds the zero Policy")
			}
		}
		multi = md
	}
	o := options{logger: slog.Default(), deny: deny, onError: writeError, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	m := &middleware{lim: l, multi: multi, rule: rule, o: o}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
	}
}

type middleware struct {
	lim   Limiter
	multi core.MultiDecider // l, when the rule has Also
	rule  Rule
	o     options
	// storeLog and failLog space the lines about store errors and about
	// undecided requests.
	storeLog, failLog throttle
}

// throttle lets one log line a second through and counts the others.
type throttle struct {
	next       atomic.Int64 // Unix ns before which lines are left out
	suppressed atomic.Int64
}

// log logs msg at level with attrs, unless a line went out less than a
// second before now.
func (t *throttle) log(ctx context.Context, l *slog.Logger, now time.Time, level slog.Level, msg string, attrs ...any) {
	ns, next := now.UnixNano(), t.next.Load()
	if ns < next || !t.next.CompareAndSwap(next, ns+int64(time.Second)) {
		t.suppressed.Add(1)
		return
	}
	if n := t.suppressed.Swap(0); n > 0 {
		attrs = append(attrs, "suppressed", n)
	}
	l.Log(ctx, level, msg, attrs...)
}

// decision is what the middleware leaves in a decided request's context.
type decision struct {
	res    core.Result
	policy string
}

type ctxKey struct{}

// FromContext returns the decision on the request whose context is ctx,
// and whether there was one: the admitting decision in the next handler,
// the denial in a deny handler. Behind nested middleware it is the
// innermost decision. An exempt request has none.
func FromContext(ctx context.Context) (core.Result, bool) {
	d, ok := ctx.Value(ctxKey{}).(decision)
	return d.res, ok
}

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if m.rule.Exempt != nil && m.rule.Exempt(r) {
		next.ServeHTTP(w, r)
		return
	}
	key, cost, err := m.request(r)
	if err != nil {
		m.fail(w, r, err)
		return
	}
	p := m.rule.Policy
	var res core.Result
	if m.multi != nil {
		if res, p, err = m.decideAll(w.Header(), r, key, cost); err != nil {
			m.fail(w, r, err)
			return
		}
	} else {
		res, err = m.lim.AllowN(r.Context(), p, key, cost)
		if err != nil {
			if res, err = m.outage(r, err); err != nil {
				m.fail(w, r, err)
				return
			}
		}
		m.setHeaders(w.Header(), p, res)
	}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, decision{res: res, policy: p.Name()}))
	if !res.Allowed {
		m.o.deny(w, r, res)
		return
	}
	next.ServeHTTP(w, r)
}

// decideAll charges the rule's policies together, sets the header fields
// of each, and returns the decision that speaks for them (see Rule.Also)
// and its policy.
func (m *middleware) decideAll(h http.Header, r *http.Request, key string, cost int64) (core.Result, core.Policy, error) {
	ps := append([]core.Policy{m.rule.Policy}, m.rule.Also...)
	reqs := make([]core.Request, len(ps))
	for i, p := range ps {
		reqs[i] = core.Request{Policy: p, Key: key, Cost: cost}
	}
	rs, err := m.multi.AllowAll(r.Context(), reqs...)
	if err != nil {
		res, err := m.outage(r, err)
		if err != nil {
			return core.Result{}, core.Policy{}, err
		}
		rs = make([]core.Result, len(ps))
		for i, p := range ps {
			rs[i] = res
			rs[i].Limit, rs[i].Remaining = p.Limit(), min(res.Remaining, p.Limit())
		}
	}
	pick := core.Governing(rs)
	for i, p := range ps {
		if i == pick {
			m.setHeaders(h, p, rs[i])
			continue
		}
		policy, rateLimit, _ := Fields(p, rs[i])
		h.Add("RateLimit-Policy", policy)
		h.Add("RateLimit", rateLimit)
	}
	return rs[pick], ps[pick], nil
}

// request returns r's client key, made safe, and its cost.
func (m *middleware) request(r *http.Request) (string, int64, error) {
	key, err := m.rule.Key(r)
	switch {
	case err != nil:
		return "", 0, err
	case key == "":
		return "", 0, &ClientError{Reason: "empty client key"}
	}
	cost := int64(1)
	if m.rule.Cost != nil {
		if cost, err = m.rule.Cost(r); err != nil {
			return "", 0, err
		}
		for i := -1; i < len(m.rule.Also); i++ {
			p := m.rule.Policy
			if i >= 0 {
				p = m.rule.Also[i]
			}
			if cost > p.Limit() {
				return "", 0, &ClientError{Reason: "request costs " + itoa(cost) + ", above the limit " + itoa(p.Limit()) + " of policy " + p.Name()}
			}
		}
	}
	return SafeKey(key), cost, nil
}

// outage turns a store error into the Rule's Outage decision. Other
// errors are returned: a request that ended, or a rule the limiter
// rejects.
func (m *middleware) outage(r *http.Request, err error) (core.Result, error) {
	if r.Context().Err() != nil || !core.FromStore(err) {
		return core.Result{}, err
	}
	class := core.ClassOf(err)
	level := slog.LevelWarn
	if class == core.ClassRequest {
		level = slog.LevelError
	}
	m.storeLog.log(r.Context(), m.o.logger, m.o.now(), level, "httplimit: store failed, request decided by the outage mode",
		"policy", m.rule.Policy.Name(), "path", r.URL.Path, "outage", m.rule.Outage.String(),
		"class", class.String(), "reason", core.ReasonOf(err), "err", err)
	return core.OutageResult(m.rule.Policy.Limit(), m.rule.Outage == FailClosed), nil
}

// fail logs an undecided request unless it is the client's fault or the
// request ended, and passes it to the error handler.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, err error) {
	_, client := errors.AsType[*ClientError](err)
	if !client && r.Context().Err() == nil {
		m.failLog.log(r.Context(), m.o.logger, m.o.now(), slog.LevelError, "httplimit: request not decided",
			"policy", m.rule.Policy.Name(), "path", r.URL.Path, "err", err)
	}
	m.o.onError(w, r, err)
}

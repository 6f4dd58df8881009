// Package httplimit is net/http middleware that rate-limits a route with a
// holdfast limiter:
//
//	rule := httplimit.Rule{Policy: policy, Key: key} // key: config.ParseKeySource("header:X-Client-ID")
//	mux.Handle("/api/tb", httplimit.New(limiter, rule)(handler))
//
// Every decided request, admitted or not, carries the RateLimit-Policy and
// RateLimit header fields of draft-ietf-httpapi-ratelimit-headers-11:
//
//	RateLimit-Policy: "tb";q=20;w=4   (quota; window in seconds)
//	RateLimit: "tb";r=5;t=3           (remaining; effective window in seconds)
//
// An admitted request reaches the handler, which can read the decision with
// FromContext; a denied one gets 429 Too Many Requests with Retry-After and
// a JSON body. A request without a client key gets 400; a limiter error
// gets 500 with a generic body that reveals neither the error nor the key.
package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/holdfast/holdfast/config"
	"github.com/holdfast/holdfast/core"
)

// Limiter decides requests; *core.Limiter and *fallback.Limiter implement
// it.
type Limiter interface {
	AllowN(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error)
}

var _ Limiter = (*core.Limiter)(nil)

// Rule is what a route is limited by: the policy, where the client key
// comes from, and what one request costs (0 means 1).
type Rule struct {
	// Policy is the limit, e.g. from config.Policy.Policy.
	Policy core.Policy
	// Key finds the client key; see config.KeySource.Extract.
	Key config.KeySource
	// Cost is what one request spends; 0 means 1.
	Cost int64
}

// An Option configures New.
type Option func(*options)

type options struct {
	logger *slog.Logger
}

// WithLogger sets where the middleware reports limiter errors; nil or
// absent means slog.Default(). Errors that are the server's own fault (an
// invalid policy or cost, a zero key source: core's bad-input errors) are
// logged at Error level, other limiter failures at Warn, with the policy
// and path; the middleware never logs a client key.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// New returns middleware that admits each request through l under rule,
// and passes admitted requests to the next handler. It panics if l is nil,
// like http.Handle with a nil handler.
func New(l Limiter, rule Rule, opts ...Option) func(http.Handler) http.Handler {
	if l == nil {
		panic("httplimit: nil Limiter")
	}
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if rule.Cost == 0 {
		rule.Cost = 1
	}
	m := &middleware{lim: l, rule: rule, log: o.logger}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
	}
}

type middleware struct {
	lim  Limiter
	rule Rule
	log  *slog.Logger
}

// decision is what the middleware leaves in an admitted request's context.
type decision struct {
	res    core.Result
	policy string
}

type ctxKey struct{}

// FromContext returns the decision that admitted the request whose context
// is ctx, and whether there was one. Behind nested middleware it is the
// innermost decision.
func FromContext(ctx context.Context) (core.Result, bool) {
	d, ok := ctx.Value(ctxKey{}).(decision)
	return d.res, ok
}

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	name := m.rule.Policy.Name()
	key, err := m.rule.Key.Extract(r)
	if err != nil {
		var ke *config.KeyError
		if errors.As(err, &ke) {
			writeJSON(w, http.StatusBadRequest, errorBody{Error: ke.Reason})
			return
		}
		m.log.Error("httplimit: no client key: server misconfigured", "policy", name, "path", r.URL.Path, "err", err)
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: internalError})
		return
	}
	res, err := m.lim.AllowN(r.Context(), m.rule.Policy, key, m.rule.Cost)
	if err != nil {
		m.logFailure(r, err)
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: internalError})
		return
	}
	setHeaders(w.Header(), m.rule.Policy, res)
	if !res.Allowed {
		deny(w, name, res)
		return
	}
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, decision{res: res, policy: name})))
}

// logFailure logs a limiter error. Bad input is the server's fault (its
// policy or rule); a cancelled request is nobody's and is not logged.
func (m *middleware) logFailure(r *http.Request, err error) {
	attrs := []any{"policy", m.rule.Policy.Name(), "path", r.URL.Path, "err", err}
	switch {
	case r.Context().Err() != nil:
	case isBadInput(err):
		m.log.Error("httplimit: rule rejected by the limiter: server misconfigured", attrs...)
	default:
		m.log.Warn("httplimit: limiter failed", attrs...)
	}
}

func isBadInput(err error) bool {
	for _, e := range []error{core.ErrInvalidPolicy, core.ErrUnknownPolicy, core.ErrInvalidCost, core.ErrCostExceedsLimit, core.ErrEmptyKey, core.ErrKeyTooLong} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Package grpclimit is gRPC server middleware that rate-limits methods
// with a holdfast limiter:
//
//	rules := grpclimit.Rules{"/shop.Orders/*": {Policy: policy, Key: grpclimit.Metadata("x-api-key")}}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiter, rules)),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiter, rules)),
//	)
//
// It is its own module, github.com/holdfast/holdfast/grpclimit, so that
// the holdfast library does not depend on gRPC.
//
// Rules chooses a method's Rule by the method's full name; a method no
// entry names passes unlimited. A Rule says, as httplimit's does for a
// route, what limits a call: the policy, whose quota a call spends (a
// KeyFunc: Metadata, Peer or your own, such as a token's subject), what
// it costs, which calls are exempt, and what a store failure does.
//
// Every decided call, admitted or not, carries in its header metadata the
// values of httplimit's RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers, see httplimit.Fields):
//
//	ratelimit-policy: "api";q=20;w=4   (quota; window in seconds)
//	ratelimit: "api";r=5;t=3           (remaining; effective window in seconds)
//
// An admitted call reaches the handler, which can read the decision with
// FromContext. A denied call does not: it ends with
// codes.ResourceExhausted, a message that names the policy, a
// google.rpc.RetryInfo detail whose RetryDelay is Result.RetryAfter, and
// retry-after (whole seconds, at least 1) in its header metadata. Clients
// read the metadata with grpc.Header, or a stream's Header method, on
// errors too.
//
// The codes a call can end with, before its handler runs:
//
//	ResourceExhausted  denied; or the store failed and the rule fails closed
//	InvalidArgument    no client key (a *httplimit.ClientError from the KeyFunc),
//	                   or a cost the policy cannot admit (below 1, above its limit)
//	a status's own     a KeyFunc or Cost that returns a gRPC status error, such
//	                   as codes.Unauthenticated for a missing credential
//	Canceled, DeadlineExceeded  the call ended before it was decided
//	Internal           the server's own error: a KeyFunc's or Cost's plain error
//	                   (its text is logged, not sent), or a rule the limiter rejects
//
// A store error never becomes Internal or Unavailable. A *fallback.Limiter
// decides through an outage itself (leases, fail_open or fail_closed) and
// returns no store errors but a key that holds the wrong type; every store
// error that reaches the interceptor, from a *core.Limiter or that one,
// is decided by the Rule's Outage: FailOpen (the default) admits the
// call, FailClosed denies it with ResourceExhausted and a one-second
// RetryInfo, and either is logged, at most once a second.
//
// A stream is limited once, when it opens: it spends the rule's cost
// before the handler runs (Cost sees a nil request), and its messages
// spend nothing. A service that limits messages calls its Limiter from
// the handler.
//
// Interceptors chained one after another add one value per policy to each
// metadata key, as nested httplimit middleware adds one list member per
// policy to each field.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/httplimit"
)

// Limiter decides calls: core.Decider, which *core.Limiter and
// *fallback.Limiter implement.
type Limiter = core.Decider

var _ Limiter = (*core.Limiter)(nil)

// Rule is what a method is limited by. Policy and Key are required; the
// zero value of every other field is its documented default.
type Rule struct {
	// Policy is the limit, e.g. from config.Policy.Policy.
	Policy core.Policy
	// Key finds the client key of a call. See KeyFunc.
	Key KeyFunc
	// Cost is what a call spends; nil means 1. req is a unary call's
	// request message, and nil for a stream (limited when it opens). A
	// cost below 1 or above the policy's limit could never be admitted:
	// the call ends with InvalidArgument. An error ends the call as a
	// KeyFunc's does.
	Cost func(ctx context.Context, fullMethod string, req any) (int64, error)
	// Exempt, when it reports true, passes the call to the handler
	// without limiting it: no key, no spend, no metadata. nil exempts
	// nothing.
	Exempt func(ctx context.Context, fullMethod string) bool
	// Outage decides a call whose limiter returned a store error; the
	// zero value is FailOpen.
	Outage Outage
	// Also are further policies charged with Policy, for the same key and
	// cost, all or nothing (core.MultiDecider.AllowAll): a call is
	// admitted only if every policy admits it, and one denied by any
	// spends none of the others. The Limiter must be a core.MultiDecider.
	// The metadata lists every policy; RetryInfo and FromContext give the
	// first denying policy's decision, or on admission the decision with
	// the least remaining.
	Also []core.Policy
}

// Outage is what the interceptor does with a call its limiter could not
// decide because the store failed.
type Outage int

const (
	// FailOpen (the default) admits the call: a limiter outage must not
	// become an API outage. The decision is {Allowed, Remaining: Limit,
	// Mode: fail_open}.
	FailOpen Outage = iota
	// FailClosed denies the call with ResourceExhausted and a RetryInfo
	// of one second, for methods such as logins where a burst is worse
	// than an outage.
	FailClosed
)

// String returns "fail_open" or "fail_closed".
func (o Outage) String() string {
	if o == FailClosed {
		return "fail_closed"
	}
	return "fail_open"
}

// Rules chooses the rule of each method by its full name,
// "/package.Service/Method": the entry of that name, else the entry
// "/package.Service/*" for every method of the service, else the entry
// "*" for every method. A method that no entry matches passes unlimited.
type Rules map[string]Rule

// The metadata keys of a decision: see the package comment.
const (
	MDPolicy     = "ratelimit-policy"
	MDRateLimit  = "ratelimit"
	MDRetryAfter = "retry-after"
)

// An Option configures an interceptor.
type Option func(*options)

type options struct {
	logger *slog.Logger
	now    func() time.Time
}

// WithLogger sets where the interceptor reports what it could not decide;
// nil or absent means slog.Default(). A store error is logged at Warn (at
// Error for a key that holds the wrong type, which will not heal), a
// server's own error (Internal) at Error, each with the policy and the
// method. Each kind is logged at most once a second, with the number of
// lines left out since the last ("suppressed"), so an outage does not log
// every call. Client errors and ended calls are not logged, and the
// interceptor never logs a client key.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithClock sets the interceptor's clock, which spaces log lines; nil or
// absent means time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// UnaryServerInterceptor returns an interceptor that admits each unary
// call through l under its method's rule (see Rules) and passes admitted
// calls to the handler. It panics if l is nil, or a rule has a nil Key or
// the zero Policy, or an entry of rules is not a method, a service's
// "/package.Service/*" or "*", like grpc.NewServer with a bad option.
func UnaryServerInterceptor(l Limiter, rules Rules, opts ...Option) grpc.UnaryServerInterceptor {
	x := newInterceptor(l, rules, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		decided, err := x.decide(ctx, info.FullMethod, req, func(md metadata.MD) { grpc.SetHeader(ctx, md) })
		if err != nil {
			return nil, err
		}
		return handler(decided, req)
	}
}

// StreamServerInterceptor returns an interceptor that admits each stream
// through l under its method's rule (see Rules) when it opens, and passes
// admitted streams to the handler. It panics as UnaryServerInterceptor
// does.
func StreamServerInterceptor(l Limiter, rules Rules, opts ...Option) grpc.StreamServerInterceptor {
	x := newInterceptor(l, rules, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		decided, err := x.decide(ctx, info.FullMethod, nil, func(md metadata.MD) { ss.SetHeader(md) })
		if err != nil {
			return err
		}
		if decided != ctx {
			ss = &serverStream{ServerStream: ss, ctx: decided}
		}
		return handler(srv, ss)
	}
}

// serverStream is a stream whose context carries its decision.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

type ctxKey struct{}

// FromContext returns the decision that admitted the call whose context
// is ctx (a stream's Context), and whether there was one. Behind chained
// interceptors it is the innermost decision. An exempt call, or one no
// rule matches, has none.
func FromContext(ctx context.Context) (core.Result, bool) {
	res, ok := ctx.Value(ctxKey{}).(core.Result)
	return res, ok
}

// interceptor is the state the unary and stream interceptors share.
type interceptor struct {
	lim Limiter
	// exact is keyed by full method name, service by "/package.Service/"
	// (so a lookup slices the name and allocates nothing); all is "*".
	exact, service map[string]Rule
	all            *Rule
	o              options
	// storeLog and failLog space the lines about store errors and about
	// undecided calls.
	storeLog, failLog throttle
}

func newInterceptor(l Limiter, rules Rules, opts []Option) *interceptor {
	if l == nil {
		panic("grpclimit: nil Limiter")
	}
	x := &interceptor{lim: l, exact: map[string]Rule{}, service: map[string]Rule{}, o: options{logger: slog.Default(), now: time.Now}}
	for name, rule := range rules {
		switch {
		case rule.Key == nil:
			panic("grpclimit: rule " + name + ": Key is nil")
		case !rule.Policy.Valid():
			panic("grpclimit: rule " + name + ": Policy is the zero Policy")
		case len(rule.Also) > 0 && !isMulti(l):
			panic("grpclimit: rule " + name + ": Also needs a Limiter that is a core.MultiDecider")
		}
		for _, p := range rule.Also {
			if !p.Valid() {
				panic("grpclimit: rule " + name + ": Also holds the zero Policy")
			}
		}
		svc, method, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/")
		switch {
		case name == "*":
			x.all = &rule
		case !strings.HasPrefix(name, "/") || !ok || svc == "" || method == "" ||
			strings.ContainsAny(svc, "*") || strings.ContainsAny(method, "/") || method != "*" && strings.ContainsAny(method, "*"):
			panic(fmt.Sprintf("grpclimit: rule %q: want \"/package.Service/Method\", \"/package.Service/*\" or \"*\"", name))
		case method == "*":
			x.service[name[:len(name)-1]] = rule
		default:
			x.exact[name] = rule
		}
	}
	for _, opt := range opts {
		opt(&x.o)
	}
	if x.o.logger == nil {
		x.o.logger = slog.Default()
	}
	if x.o.now == nil {
		x.o.now = time.Now
	}
	return x
}

// rule returns the rule of fullMethod, and whether one matches.
func (x *interceptor) rule(fullMethod string) (Rule, bool) {
	if r, ok := x.exact[fullMethod]; ok {
		return r, true
	}
	if i := strings.LastIndexByte(fullMethod, '/'); i > 0 {
		if r, ok := x.service[fullMethod[:i+1]]; ok {
			return r, true
		}
	}
	if x.all != nil {
		return *x.all, true
	}
	return Rule{}, false
}

// decide admits or refuses a call to fullMethod with request req (nil for
// a stream), sending the decision's metadata with setHeader. It returns
// the context for the handler, or the status that ends the call.
func (x *interceptor) decide(ctx context.Context, fullMethod string, req any, setHeader func(metadata.MD)) (context.Context, error) {
	rule, ok := x.rule(fullMethod)
	if !ok || rule.Exempt != nil && rule.Exempt(ctx, fullMethod) {
		return ctx, nil
	}
	key, cost, err := request(ctx, rule, fullMethod, req)
	if err != nil {
		return nil, x.fail(ctx, rule, fullMethod, err)
	}
	ps := append([]core.Policy{rule.Policy}, rule.Also...)
	var rs []core.Result
	if len(ps) == 1 {
		res, err := x.lim.AllowN(ctx, rule.Policy, key, cost)
		rs = []core.Result{res}
		if err != nil {
			rs = nil
			err = x.undecided(ctx, rule, fullMethod, err, ps, &rs)
		}
		if err != nil {
			return nil, err
		}
	} else {
		reqs := make([]core.Request, len(ps))
		for i, p := range ps {
			reqs[i] = core.Request{Policy: p, Key: key, Cost: cost}
		}
		var err error
		if rs, err = x.lim.(core.MultiDecider).AllowAll(ctx, reqs...); err != nil {
			if err = x.undecided(ctx, rule, fullMethod, err, ps, &rs); err != nil {
				return nil, err
			}
		}
	}
	pick := core.Governing(rs)
	md := metadata.MD{}
	for i, p := range ps {
		policy, rateLimit, retry := httplimit.Fields(p, rs[i])
		md.Append(MDPolicy, policy)
		md.Append(MDRateLimit, rateLimit)
		if i == pick && retry != "" {
			md[MDRetryAfter] = []string{retry}
		}
	}
	setHeader(md) // fails only outside a gRPC server: nothing to send to
	res := rs[pick]
	if !res.Allowed {
		return nil, denied(ps[pick], res)
	}
	return context.WithValue(ctx, ctxKey{}, res), nil
}

// undecided turns a store error on a call limited by policies ps into the
// rule's Outage decision for each of them, in *rs; any other error ends
// the call.
func (x *interceptor) undecided(ctx context.Context, rule Rule, fullMethod string, err error, ps []core.Policy, rs *[]core.Result) error {
	res, err := x.outage(ctx, rule, fullMethod, err)
	if err != nil {
		return x.fail(ctx, rule, fullMethod, err)
	}
	*rs = make([]core.Result, len(ps))
	for i, p := range ps {
		(*rs)[i] = core.OutageResult(p.Limit(), rule.Outage == FailClosed)
		(*rs)[i].RetryAfter = res.RetryAfter
	}
	return nil
}

// isMulti reports whether l charges several limits at once.
func isMulti(l Limiter) bool {
	_, ok := l.(core.MultiDecider)
	return ok
}

// request returns the call's client key, made safe by httplimit.SafeKey,
// and its cost.
func request(ctx context.Context, rule Rule, fullMethod string, req any) (string, int64, error) {
	key, err := rule.Key(ctx, fullMethod)
	switch {
	case err != nil:
		return "", 0, err
	case key == "":
		return "", 0, &httplimit.ClientError{Reason: "empty client key"}
	}
	cost := int64(1)
	if rule.Cost != nil {
		if cost, err = rule.Cost(ctx, fullMethod, req); err != nil {
			return "", 0, err
		}
		for _, p := range append([]core.Policy{rule.Policy}, rule.Also...) {
			if cost < 1 || cost > p.Limit() {
				return "", 0, &httplimit.ClientError{Reason: fmt.Sprintf("call costs %d; policy %s admits costs from 1 to %d", cost, p.Name(), p.Limit())}
			}
		}
	}
	return httplimit.SafeKey(key), cost, nil
}

// denied returns the status of a denial: ResourceExhausted with RetryInfo.
func denied(p core.Policy, res core.Result) error {
	msg := fmt.Sprintf("rate limited by policy %q", p.Name())
	if res.Mode == core.ModeFailClosed {
		msg += " (limiter unavailable, failing closed)"
	}
	st := status.New(codes.ResourceExhausted, msg)
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)}); err == nil {
		st = d // WithDetails fails only if RetryInfo cannot be marshalled
	}
	return st.Err()
}

// outage turns a store error into the rule's Outage decision. Other
// errors are returned: a call that ended, or a rule the limiter rejects.
func (x *interceptor) outage(ctx context.Context, rule Rule, fullMethod string, err error) (core.Result, error) {
	if ctx.Err() != nil || !core.FromStore(err) {
		return core.Result{}, err
	}
	class := core.ClassOf(err)
	level := slog.LevelWarn
	if class == core.ClassRequest {
		level = slog.LevelError
	}
	x.storeLog.log(ctx, x.o.logger, x.o.now(), level, "grpclimit: store failed, call decided by the outage mode",
		"policy", rule.Policy.Name(), "method", fullMethod, "outage", rule.Outage.String(),
		"class", class.String(), "reason", core.ReasonOf(err), "err", err)
	return core.OutageResult(rule.Policy.Limit(), rule.Outage == FailClosed), nil
}

// fail returns the status of a call the interceptor did not decide (see
// the package comment), logging the server's own errors.
func (x *interceptor) fail(ctx context.Context, rule Rule, fullMethod string, err error) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	if ce, ok := errors.AsType[*httplimit.ClientError](err); ok {
		return status.Error(codes.InvalidArgument, ce.Reason)
	}
	if errors.Is(err, core.ErrInvalidCost) || errors.Is(err, core.ErrCostExceedsLimit) {
		return status.Error(codes.InvalidArgument, err.Error()) // from a Limiter that checks costs itself
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	x.failLog.log(ctx, x.o.logger, x.o.now(), slog.LevelError, "grpclimit: call not decided",
		"policy", rule.Policy.Name(), "method", fullMethod, "err", err)
	return status.Error(codes.Internal, "internal error")
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

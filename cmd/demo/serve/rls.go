package serve

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/holdfast/holdfast/cmd/demo/serve/rls"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/httplimit"
)

// The Envoy rate limit service (--grpc-listen): envoy.service.ratelimit.v3
// RateLimitService/ShouldRateLimit on the instance's one fallback limiter,
// beside the HTTP routes, with the gRPC health service.
//
// A request's descriptors are matched by package rls. The ones whose
// limit is enforced are charged together, all or nothing (AllowAll,
// cost hits_addend): OVER_LIMIT if any denies, and then none of them is
// spent. A shadow_mode limit is charged on its own and answers OK; an
// unlimited one answers OK with limit_remaining 2^32-1; a descriptor
// that matches no limit, or whose limit another's replaces dropped,
// answers OK without current_limit, as does every descriptor of a domain
// the config lacks (envoyproxy/ratelimit's answers). A descriptor's own
// hits_addend of 0 checks without spending. A limit of 0, or a cost above
// the limit, is OVER_LIMIT without spending anything. A limit Envoy sends
// with a descriptor (a route's override) applies instead of the config's,
// a token bucket keyed by all the descriptor's keys and values.
//
// A malformed request (empty domain, no descriptors, a descriptor without
// entries, an empty key, an entry above 256 bytes, more than 64
// descriptors or 16 entries, is_negative_hits, a limit override of an
// unknown unit) ends with InvalidArgument
// and spends nothing. Redis never makes an answer UNAVAILABLE: the
// limiter decides through an outage by each limit's outage mode, and the
// response then carries x-holdfast-mode (local, fail_open or fail_closed).
//
// Each decided descriptor's status has current_limit (as configured),
// limit_remaining (Result.Remaining: during an outage of this instance's
// share) and duration_until_reset (ResetAfter when admitted, RetryAfter
// when denied). response_headers_to_add carries httplimit's
// RateLimit-Policy and RateLimit fields, one list member per enforced
// limit, and Retry-After on OVER_LIMIT, for Envoy to forward;
// x-holdfast-mode goes in request_headers_to_add too, for the upstream.

// ModeHeader is the response header that marks a degraded decision.
const ModeHeader = "x-holdfast-mode"

// maxUint32 is limit_remaining of an unlimited descriptor.
const maxUint32 = math.MaxUint32

// rlsService is the RLS v3 server of one App.
type rlsService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg  *rls.Config
	dec  core.MultiDecider // the limiter counted by metrics
	lim  *fallback.Limiter // Peek
	log  *slog.Logger
	last atomic.Int64 // unix seconds of the last store failure logged

	decisions *prometheus.CounterVec
	requests  *prometheus.CounterVec
}

func (a *App) newRLS(cfg *rls.Config) {
	s := &rlsService{
		cfg: cfg, lim: a.lim, log: a.log,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "holdfast", Subsystem: "rls", Name: "descriptors_total",
			Help: "RLS descriptor decisions by domain, descriptor (its keys from the config, never a value), result (ok, over_limit, shadow_over_limit, unlimited, unmatched, replaced) and mode (redis, local, fail_open, fail_closed; none when nothing was decided).",
		}, []string{"domain", "descriptor", "result", "mode"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "holdfast", Subsystem: "rls", Name: "requests_total",
			Help: "RLS ShouldRateLimit calls by domain (\"unknown\" for one the config lacks, \"\" for a malformed call) and code (ok, over_limit, invalid_argument, canceled).",
		}, []string{"domain", "code"}),
	}
	s.dec = a.metrics.Limiter(a.lim).(core.MultiDecider)
	a.metrics.Registry().MustRegister(s.decisions, s.requests)
	a.rls = s
	a.health = health.NewServer()
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	a.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	a.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(1 << 20))
	rlsv3.RegisterRateLimitServiceServer(a.grpc, s)
	healthpb.RegisterHealthServer(a.grpc, a.health)
}

// GRPCServer returns the rate limit service's gRPC server (RLS v3 and
// health), nil without --rls-config.
func (a *App) GRPCServer() *grpc.Server { return a.grpc }

// ShouldRateLimit decides one request of Envoy's rate limit filter.
func (s *rlsService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	descs := make([]rls.Descriptor, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		if d.GetIsNegativeHits() {
			return nil, s.invalid(fmt.Sprintf("rls: descriptor %d: is_negative_hits is not supported", i))
		}
		if o := d.GetLimit(); o != nil {
			descs[i].Override = &rls.OverrideLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: rls.Unit(o.GetUnit())}
		}
		es := make([]rls.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			es[j] = rls.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		descs[i].Entries = es
		if h := d.GetHitsAddend(); h != nil {
			v := h.GetValue()
			descs[i].Hits = &v
		}
	}
	items, known, err := s.cfg.Plan(req.GetDomain(), descs, req.GetHitsAddend())
	if err != nil {
		return nil, s.invalid(err.Error())
	}
	domain := req.GetDomain()
	if !known {
		domain = "unknown"
	}
	resp, err := s.decide(ctx, domain, items)
	if err != nil {
		s.requests.WithLabelValues(domain, "canceled").Inc()
		return nil, err
	}
	s.requests.WithLabelValues(domain, strings.ToLower(resp.OverallCode.String())).Inc()
	return resp, nil
}

func (s *rlsService) invalid(msg string) error {
	s.requests.WithLabelValues("", "invalid_argument").Inc()
	return status.Error(codes.InvalidArgument, msg)
}

// decision is how one descriptor was decided.
type decision struct {
	res     core.Result
	decided bool // res holds a decision (or a peek) of the limit's policy
	blocked bool // over the limit without a decision: a zero limit, or a cost above it
}

// decide decides the planned descriptors and builds the response.
func (s *rlsService) decide(ctx context.Context, domain string, items []rls.Item) (*rlsv3.RateLimitResponse, error) {
	ds := make([]decision, len(items))
	var enforced []int
	blocked := false
	for i, it := range items {
		l := it.Limit
		switch {
		case l == nil || l.Unlimited:
		case it.Cost == 0 && !l.Policy.Valid():
			// A check of a zero limit: nothing spent, nothing over.
		case !l.Policy.Valid() || it.Cost > uint64(l.Policy.Limit()):
			ds[i].blocked = true
			blocked = blocked || !l.ShadowMode
		case it.Cost == 0:
			r, err := s.outcome(ctx, l)(s.lim.Peek(ctx, l.Policy, it.Key, 1))
			if err != nil {
				return nil, err
			}
			// Nothing spent, so never over the limit; the peek answers as
			// if one hit were spent: Remaining is one more now (ResetAfter
			// stays that of one more hit, an upper bound).
			if r.Allowed {
				r.Remaining++
			}
			r.Allowed = true
			ds[i] = decision{res: r, decided: true}
		case l.ShadowMode:
			r, err := s.outcome(ctx, l)(s.dec.AllowN(ctx, l.Policy, it.Key, int64(it.Cost)))
			if err != nil {
				return nil, err
			}
			ds[i] = decision{res: r, decided: true}
		default:
			enforced = append(enforced, i)
		}
	}
	if len(enforced) > 0 {
		if err := s.charge(ctx, items, ds, enforced, blocked); err != nil {
			return nil, err
		}
	}
	return s.response(domain, items, ds), nil
}

// charge decides the enforced descriptors: all or nothing through
// AllowAll, or, when one is blocked, peeked (nothing is spent).
func (s *rlsService) charge(ctx context.Context, items []rls.Item, ds []decision, enforced []int, blocked bool) error {
	if blocked {
		for _, i := range enforced {
			it := items[i]
			r, err := s.outcome(ctx, it.Limit)(s.lim.Peek(ctx, it.Limit.Policy, it.Key, int64(it.Cost)))
			if err != nil {
				return err
			}
			ds[i] = decision{res: r, decided: true}
		}
		return nil
	}
	reqs := make([]core.Request, len(enforced))
	for j, i := range enforced {
		reqs[j] = core.Request{Policy: items[i].Limit.Policy, Key: items[i].Key, Cost: int64(items[i].Cost)}
	}
	rs, err := s.dec.AllowAll(ctx, reqs...)
	if err != nil {
		rs = make([]core.Result, len(enforced))
		for j, i := range enforced {
			if rs[j], err = s.outcome(ctx, items[i].Limit)(core.Result{}, err); err != nil {
				return err
			}
		}
	}
	for j, i := range enforced {
		ds[i] = decision{res: rs[j], decided: true}
	}
	return nil
}

// outcome returns what turns a limiter's answer for limit l into the
// decision: the Result itself; the call's gRPC status when ctx ended (Envoy
// gave up); else, for an error (only a request error reaches here, as the
// fallback limiter decides store failures itself), l's outage mode.
func (s *rlsService) outcome(ctx context.Context, l *rls.Limit) func(core.Result, error) (core.Result, error) {
	return func(r core.Result, err error) (core.Result, error) {
		switch {
		case err == nil:
			return r, nil
		case ctx.Err() != nil:
			return core.Result{}, status.FromContextError(ctx.Err()).Err()
		}
		return s.storeFailed(l, err), nil
	}
}

// storeFailed is the decision of limit l when the limiter returned err: by
// l's outage mode, logged at most once a second.
func (s *rlsService) storeFailed(l *rls.Limit, err error) core.Result {
	if now := time.Now().Unix(); s.last.Swap(now) != now {
		s.log.Warn("holdfast rls: limiter error, deciding by the outage mode", "domain", l.Domain, "descriptor", l.KeyPath, "err", err)
	}
	lim := l.Policy.Limit()
	if l.Outage == fallback.FailClosed {
		return core.Result{Limit: lim, RetryAfter: time.Second, Mode: core.ModeFailClosed, Degraded: true}
	}
	return core.Result{Allowed: true, Limit: lim, Remaining: lim, Mode: core.ModeFailOpen, Degraded: true}
}

// response builds the response from the decisions.
func (s *rlsService) response(domain string, items []rls.Item, ds []decision) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	var policies, limits []string
	var retry time.Duration
	mode := ""
	for i, it := range items {
		l, d := it.Limit, ds[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		result, m := "unmatched", "none"
		switch {
		case it.Replaced:
			result = "replaced"
		case l == nil:
		case l.Unlimited:
			result, st.LimitRemaining = "unlimited", maxUint32
		default:
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)}
			over, wait := d.blocked, l.Unit.Duration()
			if d.decided {
				over = !d.res.Allowed
				st.LimitRemaining = uint32(min(max(d.res.Remaining, 0), maxUint32))
				wait = d.res.ResetAfter
				if over {
					wait = d.res.RetryAfter
				}
				m = d.res.Mode.String()
				if d.res.Degraded && mode == "" {
					mode = m
				}
			}
			st.DurationUntilReset = durationpb.New(wait)
			result = "ok"
			switch {
			case over && l.ShadowMode:
				result = "shadow_over_limit"
			case over:
				result = "over_limit"
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				retry = max(retry, wait)
			}
			if d.decided && !l.ShadowMode {
				p, r, _ := httplimit.Fields(l.Policy, d.res)
				policies, limits = append(policies, p), append(limits, r)
			}
		}
		key := ""
		if l != nil {
			key = l.KeyPath
		}
		s.decisions.WithLabelValues(domain, key, result, m).Inc()
	}
	h := func(k, v string) {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
	}
	if len(policies) > 0 {
		h("RateLimit-Policy", strings.Join(policies, ", "))
		h("RateLimit", strings.Join(limits, ", "))
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		secs := int64(max((retry+time.Second-1)/time.Second, 1))
		h("Retry-After", strconv.FormatInt(secs, 10))
	}
	if mode != "" {
		// To the client, and to the upstream: both may log the outage.
		h(ModeHeader, mode)
		resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd, &corev3.HeaderValue{Key: ModeHeader, Value: mode})
	}
	return resp
}

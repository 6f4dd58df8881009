package grpclimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
	"github.com/holdfast/holdfast/grpclimit"
	"github.com/holdfast/holdfast/httplimit"
)

var _ grpclimit.Limiter = (*fallback.Limiter)(nil)

const (
	check = "/grpc.health.v1.Health/Check"
	watch = "/grpc.health.v1.Health/Watch"
)

// faulty is a driver.Store that fails every call with its error while one
// is set, and otherwise runs the memory store it wraps.
type faulty struct {
	inner *memory.Store
	err   atomic.Pointer[error]
}

func (f *faulty) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	if err := f.err.Load(); err != nil {
		return nil, *err
	}
	return f.inner.Run(ctx, s, keys, args)
}

func (f *faulty) fail(err error) { f.err.Store(&err) }
func (f *faulty) heal()          { f.err.Store(nil) }

// recorder is a Limiter that records the keys and costs it is asked for.
type recorder struct {
	grpclimit.Limiter
	mu    sync.Mutex
	keys  []string
	costs []int64
}

func (r *recorder) AllowN(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error) {
	r.mu.Lock()
	r.keys, r.costs = append(r.keys, key), append(r.costs, cost)
	r.mu.Unlock()
	return r.Limiter.AllowN(ctx, p, key, cost)
}

// AllowAll passes several limits on, when the limiter charges them.
func (r *recorder) AllowAll(ctx context.Context, reqs ...core.Request) ([]core.Result, error) {
	return r.Limiter.(core.MultiDecider).AllowAll(ctx, reqs...)
}

func (r *recorder) calls() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.keys, r.costs)
}

// logBuffer is a bytes.Buffer the server's goroutines write to while a
// test reads it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// harness is a core.Limiter over a faulty memory store at a clock the test
// moves, and what the server it starts saw.
type harness struct {
	now   atomic.Int64 // Unix ns
	store *faulty
	lim   *recorder
	logs  logBuffer
	// handled counts the calls that reached a handler; remaining holds
	// the Remaining of the decision each found in its context.
	handled   atomic.Int64
	mu        sync.Mutex
	remaining []int64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{}
	h.now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	store, err := memory.New(memory.Options{Clock: h.clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	h.store = &faulty{inner: store}
	lim, err := core.NewLimiter(h.store, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.lim = &recorder{Limiter: lim}
	return h
}

func (h *harness) clock() time.Time        { return time.Unix(0, h.now.Load()) }
func (h *harness) advance(d time.Duration) { h.now.Add(int64(d)) }

// serve starts a gRPC server on a free loopback port with the health
// service behind both interceptors over rules, and returns a client.
func (h *harness) serve(t *testing.T, rules grpclimit.Rules) healthpb.HealthClient {
	t.Helper()
	opts := []grpclimit.Option{grpclimit.WithLogger(slog.New(slog.NewTextHandler(&h.logs, nil))), grpclimit.WithClock(h.clock)}
	count := func(ctx context.Context) {
		h.handled.Add(1)
		if res, ok := grpclimit.FromContext(ctx); ok {
			h.mu.Lock()
			h.remaining = append(h.remaining, res.Remaining)
			h.mu.Unlock()
		}
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(h.lim, rules, opts...),
			func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				count(ctx)
				return handler(ctx, req)
			}),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(h.lim, rules, opts...),
			func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
				count(ss.Context())
				return handler(srv, ss)
			}),
	)
	hs := health.NewServer()
	hs.SetServingStatus("batch", healthpb.HealthCheckResponse_SERVING) // for TestCost
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func (h *harness) decisions() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprint(h.remaining)
}

func policy(t *testing.T, name string, capacity int64, perSecond float64) core.Policy {
	t.Helper()
	p, err := tokenbucket.Policy(name, capacity, perSecond)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// withKey returns a context whose call carries x-client-id: key (none if
// key is "").
func withKey(key string) context.Context {
	ctx := context.Background()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", key)
	}
	return ctx
}

// outcome is what a test compares of a finished call: its code and
// message, its RetryInfo delay, and its rate-limit metadata.
func outcome(md metadata.MD, err error) string {
	st := status.Convert(err)
	retry := "-"
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri.GetRetryDelay().AsDuration().String()
		}
	}
	get := func(k string) string { return strings.Join(md.Get(k), ",") }
	return fmt.Sprintf("%s %q retry=%s | %s | %s | %s", st.Code(), st.Message(), retry,
		get(grpclimit.MDPolicy), get(grpclimit.MDRateLimit), get(grpclimit.MDRetryAfter))
}

func checkCall(c healthpb.HealthClient, ctx context.Context, service string) string {
	var md metadata.MD
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.Header(&md))
	return outcome(md, err)
}

// watchCall opens a Watch stream and reads its first message.
func watchCall(c healthpb.HealthClient, ctx context.Context) string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return outcome(nil, err)
	}
	msg, err := s.Recv()
	md, _ := s.Header()
	if err == nil && msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("status %v", msg.GetStatus())
	}
	return outcome(md, err)
}

func compare(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\ngot  %s\nwant %s", what, got, want)
	}
}

// TestUnary: a bucket of 3 refilled at 1/s admits exactly 3 Check calls
// of one client at one instant, with exact metadata, then denies with
// ResourceExhausted, a RetryInfo of exactly the bucket's retry time and
// retry-after; the handler runs only for the admitted calls. Another
// client has its own bucket, and a second later one more call is admitted.
func TestUnary(t *testing.T) {
	h := newHarness(t)
	c := h.serve(t, grpclimit.Rules{check: {Policy: policy(t, "api", 3, 1), Key: grpclimit.Metadata("X-Client-ID")}})
	want := []string{
		`OK "" retry=- | "api";q=3;w=3 | "api";r=2;t=1 | `,
		`OK "" retry=- | "api";q=3;w=3 | "api";r=1;t=2 | `,
		`OK "" retry=- | "api";q=3;w=3 | "api";r=0;t=3 | `,
		`ResourceExhausted "rate limited by policy \"api\"" retry=1s | "api";q=3;w=3 | "api";r=0;t=1 | 1`,
		`ResourceExhausted "rate limited by policy \"api\"" retry=1s | "api";q=3;w=3 | "api";r=0;t=1 | 1`,
	}
	for i, w := range want {
		compare(t, fmt.Sprint("call ", i+1), checkCall(c, withKey("client-a"), ""), w)
	}
	compare(t, "other client", checkCall(c, withKey("client-b"), ""), want[0])
	h.advance(time.Second)
	compare(t, "a second later", checkCall(c, withKey("client-a"), ""), `OK "" retry=- | "api";q=3;w=3 | "api";r=0;t=3 | `)
	compare(t, "and then", checkCall(c, withKey("client-a"), ""), want[3])
	if n := h.handled.Load(); n != 5 {
		t.Errorf("handler ran %d times, want 5 (3 + 1 + 1 admitted)", n)
	}
	compare(t, "decisions in the handler's context", h.decisions(), "[2 1 0 2 0]")
}

// TestStream: a Watch stream spends once, when it opens: a bucket of 2
// admits exactly 2 streams (each receiving its first message after the
// metadata) and the third ends with ResourceExhausted before the handler
// runs.
func TestStream(t *testing.T) {
	h := newHarness(t)
	rule := grpclimit.Rule{Policy: policy(t, "watch", 2, 0.5), Key: grpclimit.Metadata("x-client-id")}
	c := h.serve(t, grpclimit.Rules{watch: rule})
	for i, w := range []string{
		`OK "" retry=- | "watch";q=2;w=4 | "watch";r=1;t=2 | `,
		`OK "" retry=- | "watch";q=2;w=4 | "watch";r=0;t=4 | `,
		`ResourceExhausted "rate limited by policy \"watch\"" retry=2s | "watch";q=2;w=4 | "watch";r=0;t=2 | 2`,
	} {
		compare(t, fmt.Sprint("stream ", i+1), watchCall(c, withKey("client-a")), w)
	}
	if n := h.handled.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
	compare(t, "decisions in the stream's context", h.decisions(), "[1 0]")
	// Check has no rule: it passes, without metadata, and spends nothing.
	compare(t, "unmatched method", checkCall(c, withKey("client-a"), ""), `OK "" retry=- |  |  | `)
	compare(t, "limiter calls", h.lim.calls(), "[client-a client-a client-a] [1 1 1]")
}

// TestConcurrent: 24 calls at once from one client against a bucket of 5
// at one instant: exactly 5 are admitted, the rest are ResourceExhausted.
func TestConcurrent(t *testing.T) {
	h := newHarness(t)
	rule := grpclimit.Rule{Policy: policy(t, "api", 5, 1), Key: grpclimit.Metadata("x-client-id")}
	c := h.serve(t, grpclimit.Rules{"*": rule})
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[codes.Code]int{}
	for i := range 24 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				_, err = c.Check(withKey("client-a"), &healthpb.HealthCheckRequest{})
			} else {
				ctx, cancel := context.WithCancel(withKey("client-a"))
				defer cancel()
				var s healthpb.Health_WatchClient
				if s, err = c.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
					_, err = s.Recv()
				}
			}
			mu.Lock()
			got[status.Code(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if got[codes.OK] != 5 || got[codes.ResourceExhausted] != 19 || len(got) != 2 {
		t.Errorf("codes %v, want 5 OK and 19 ResourceExhausted", got)
	}
	if n := h.handled.Load(); n != 5 {
		t.Errorf("handler ran %d times, want 5", n)
	}
}

// TestKeys: a call without a usable key spends nothing and sends no
// metadata: InvalidArgument for a missing or empty key, a KeyFunc's own
// status as it is, Internal (logged, not sent) for a KeyFunc's plain
// error. Keys pass through httplimit.SafeKey.
func TestKeys(t *testing.T) {
	long := strings.Repeat("k", httplimit.MaxVerbatimKeyLen+1)
	tests := []struct {
		name string
		key  grpclimit.KeyFunc
		ctx  context.Context
		want string
		log  string // in the log, if not ""
		// calls is what the limiter was asked: keys and costs.
		calls string
	}{
		{"metadata", grpclimit.Metadata("x-client-id"), withKey("  client-a "),
			`OK "" retry=- | "api";q=3;w=3 | "api";r=2;t=1 | `, "", "[client-a] [1]"},
		{"long key hashed", grpclimit.Metadata("x-client-id"), withKey(long),
			`OK "" retry=- | "api";q=3;w=3 | "api";r=2;t=1 | `, "", "[" + httplimit.SafeKey(long) + "] [1]"},
		{"missing metadata", grpclimit.Metadata("x-client-id"), withKey(""),
			`InvalidArgument "missing metadata x-client-id" retry=- |  |  | `, "", "[] []"},
		{"blank metadata", grpclimit.Metadata("x-client-id"), withKey(" "),
			`InvalidArgument "missing metadata x-client-id" retry=- |  |  | `, "", "[] []"},
		{"empty key", func(context.Context, string) (string, error) { return "", nil }, withKey(""),
			`InvalidArgument "empty client key" retry=- |  |  | `, "", "[] []"},
		{"status error", func(context.Context, string) (string, error) {
			return "", status.Error(codes.Unauthenticated, "no api key")
		}, withKey(""), `Unauthenticated "no api key" retry=- |  |  | `, "", "[] []"},
		{"plain error", func(context.Context, string) (string, error) {
			return "", errors.New("token store down")
		}, withKey(""), `Internal "internal error" retry=- |  |  | `, "level=ERROR msg=\"grpclimit: call not decided\" policy=api method=/grpc.health.v1.Health/Check err=\"token store down\"", "[] []"},
		{"peer", grpclimit.Peer(httplimit.IPOptions{}), withKey(""),
			`OK "" retry=- | "api";q=3;w=3 | "api";r=2;t=1 | `, "", "[127.0.0.1] [1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			c := h.serve(t, grpclimit.Rules{check: {Policy: policy(t, "api", 3, 1), Key: tt.key}})
			compare(t, "call", checkCall(c, tt.ctx, ""), tt.want)
			compare(t, "limiter calls", h.lim.calls(), tt.calls)
			if logs := h.logs.String(); tt.log == "" && logs != "" || !strings.Contains(logs, tt.log) {
				t.Errorf("log %q, want %q", logs, tt.log)
			}
		})
	}
}

// TestCost: a rule's Cost sees a unary call's request (nil for a stream);
// a cost the policy cannot admit is InvalidArgument and spends nothing.
func TestCost(t *testing.T) {
	h := newHarness(t)
	var streamReq atomic.Value
	rule := grpclimit.Rule{
		Policy: policy(t, "api", 3, 1),
		Key:    grpclimit.Metadata("x-client-id"),
		Cost: func(_ context.Context, method string, req any) (int64, error) {
			if method == watch {
				streamReq.Store(fmt.Sprint(req))
				return 1, nil
			}
			switch req.(*healthpb.HealthCheckRequest).GetService() {
			case "batch":
				return 2, nil
			case "huge":
				return 4, nil
			case "free":
				return 0, nil
			case "anonymous":
				return 0, status.Error(codes.PermissionDenied, "not for you")
			}
			return 1, nil
		},
	}
	c := h.serve(t, grpclimit.Rules{"/grpc.health.v1.Health/*": rule})
	for _, step := range []struct{ service, want string }{
		{"huge", `InvalidArgument "call costs 4; policy api admits costs from 1 to 3" retry=- |  |  | `},
		{"free", `InvalidArgument "call costs 0; policy api admits costs from 1 to 3" retry=- |  |  | `},
		{"anonymous", `PermissionDenied "not for you" retry=- |  |  | `},
		{"batch", `OK "" retry=- | "api";q=3;w=3 | "api";r=1;t=2 | `},
		{"batch", `ResourceExhausted "rate limited by policy \"api\"" retry=1s | "api";q=3;w=3 | "api";r=1;t=1 | 1`},
		{"", `OK "" retry=- | "api";q=3;w=3 | "api";r=0;t=3 | `},
	} {
		compare(t, step.service, checkCall(c, withKey("client-a"), step.service), step.want)
	}
	h.advance(time.Second)
	compare(t, "stream", watchCall(c, withKey("client-a")), `OK "" retry=- | "api";q=3;w=3 | "api";r=0;t=3 | `)
	if got := streamReq.Load(); got != "<nil>" {
		t.Errorf("a stream's Cost saw req %v, want nil", got)
	}
	compare(t, "limiter calls", h.lim.calls(), "[client-a client-a client-a client-a] [2 2 1 1]")
	if logs := h.logs.String(); logs != "" {
		t.Errorf("client errors logged: %q", logs)
	}
}

// storeErrors are failures of each class a store can return.
var storeErrors = []struct {
	name, class, level string
	err                error
}{
	{"OOM reply", "unavailable", "WARN", &core.StoreError{Class: core.ClassUnavailable, Reason: "OOM", Answered: true, Err: errors.New("OOM command not allowed when used memory > 'maxmemory'")}},
	{"connection refused", "unavailable", "WARN", fmt.Errorf("%w: dial tcp 10.0.0.7:6379: connection refused", core.ErrStoreUnavailable)},
	{"store deadline", "unavailable", "WARN", fmt.Errorf("goredis: run tb: %w", context.DeadlineExceeded)},
	{"unknown reply", "unknown", "WARN", &core.StoreError{Class: core.ClassUnknown, Reason: "unknown", Answered: true, Err: errors.New("ERR something new")}},
	{"malformed reply", "unknown", "WARN", fmt.Errorf("%w: reply [1 2]", core.ErrMalformedReply)},
	{"WRONGTYPE", "request", "ERROR", &core.StoreError{Class: core.ClassRequest, Reason: "WRONGTYPE", Answered: true, Err: errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")}},
	{"bare wrong type", "request", "ERROR", fmt.Errorf("%w: hf:{tb:x}", core.ErrWrongType)},
}

// TestStoreErrors: a store failing with each error class, through a
// core.Limiter (which returns store errors), gives the rule's Outage
// decision with exact codes and metadata on unary calls and streams,
// never Internal or Unavailable; the log names the class at Warn (Error
// for WRONGTYPE, which will not heal) and never the key.
func TestStoreErrors(t *testing.T) {
	outages := []struct {
		outage grpclimit.Outage
		want   string
	}{
		{grpclimit.FailOpen, `OK "" retry=- | "api";q=3;w=3 | "api";r=3;t=0 | `},
		{grpclimit.FailClosed, `ResourceExhausted "rate limited by policy \"api\" (limiter unavailable, failing closed)" retry=1s | "api";q=3;w=3 | "api";r=0;t=1 | 1`},
	}
	for _, o := range outages {
		for _, e := range storeErrors {
			t.Run(o.outage.String()+"/"+e.name, func(t *testing.T) {
				h := newHarness(t)
				rule := grpclimit.Rule{Policy: policy(t, "api", 3, 1), Key: grpclimit.Metadata("x-client-id"), Outage: o.outage}
				c := h.serve(t, grpclimit.Rules{"*": rule})
				h.store.fail(e.err)
				compare(t, "unary", checkCall(c, withKey("client-secret"), ""), o.want)
				compare(t, "stream", watchCall(c, withKey("client-secret")), o.want)
				logs := h.logs.String()
				for _, want := range []string{"level=" + e.level, "policy=api", "method=" + check, "class=" + e.class, "outage=" + o.outage.String()} {
					if !strings.Contains(logs, want) {
						t.Errorf("log %q lacks %s", logs, want)
					}
				}
				if strings.Contains(logs, "client-secret") {
					t.Errorf("log names the key: %q", logs)
				}
				// Healed, the store decides again: nothing was spent.
				h.store.heal()
				compare(t, "healed", checkCall(c, withKey("client-secret"), ""), `OK "" retry=- | "api";q=3;w=3 | "api";r=2;t=1 | `)
			})
		}
	}
}

// TestStoreErrorLog: through an outage the store error is logged at most
// once a second, with the count of lines left out.
func TestStoreErrorLog(t *testing.T) {
	h := newHarness(t)
	c := h.serve(t, grpclimit.Rules{"*": {Policy: policy(t, "api", 3, 1), Key: grpclimit.Metadata("x-client-id")}})
	h.store.fail(fmt.Errorf("%w: connection refused", core.ErrStoreUnavailable))
	lines := func() int { return strings.Count(h.logs.String(), "store failed") }
	for range 5 {
		checkCall(c, withKey("a"), "")
	}
	if n := lines(); n != 1 {
		t.Fatalf("%d lines for 5 calls in one instant, want 1", n)
	}
	h.advance(999 * time.Millisecond)
	checkCall(c, withKey("a"), "")
	h.advance(time.Millisecond)
	checkCall(c, withKey("a"), "")
	if n, logs := lines(), h.logs.String(); n != 2 || !strings.Contains(logs, "suppressed=5") {
		t.Errorf("%d lines, want 2, the second with suppressed=5: %q", n, logs)
	}
}

// TestCanceled: a call that ended before the limiter decided ends with
// its context's code, not Internal or Unavailable, and is not logged.
func TestCanceled(t *testing.T) {
	h := newHarness(t)
	var logs logBuffer
	rules := grpclimit.Rules{"*": {Policy: policy(t, "api", 3, 1), Key: grpclimit.Metadata("x-client-id")}}
	unary := grpclimit.UnaryServerInterceptor(h.lim, rules, grpclimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	handler := func(context.Context, any) (any, error) { return "ran", nil }
	md := metadata.Pairs("x-client-id", "a")

	canceled, cancel := context.WithCancel(metadata.NewIncomingContext(context.Background(), md))
	cancel()
	h.store.fail(fmt.Errorf("goredis: run tb: %w", context.Canceled))
	_, err := unary(canceled, nil, &grpc.UnaryServerInfo{FullMethod: check}, handler)
	compare(t, "canceled", outcome(nil, err), `Canceled "context canceled" retry=- |  |  | `)

	expired, cancel := context.WithDeadline(metadata.NewIncomingContext(context.Background(), md), time.Unix(0, 0))
	defer cancel()
	h.store.fail(fmt.Errorf("goredis: run tb: %w", context.DeadlineExceeded))
	_, err = unary(expired, nil, &grpc.UnaryServerInfo{FullMethod: check}, handler)
	compare(t, "expired", outcome(nil, err), `DeadlineExceeded "context deadline exceeded" retry=- |  |  | `)
	if logs.String() != "" {
		t.Errorf("ended calls logged: %q", logs.String())
	}

	// Called outside a gRPC server, the interceptor still decides (it
	// has nowhere to send metadata).
	h.store.heal()
	res, err := unary(metadata.NewIncomingContext(context.Background(), md), nil, &grpc.UnaryServerInfo{FullMethod: check}, handler)
	if res != "ran" || err != nil {
		t.Errorf("got %v, %v; want ran, nil", res, err)
	}
}

// TestRules: a method's own entry wins over its service's, which wins
// over "*"; an exempt call spends nothing and gets no metadata; a method
// no entry matches passes.
func TestRules(t *testing.T) {
	h := newHarness(t)
	key := grpclimit.Metadata("x-client-id")
	c := h.serve(t, grpclimit.Rules{
		check: {Policy: policy(t, "check", 3, 1), Key: key,
			Exempt: func(ctx context.Context, _ string) bool {
				md, _ := metadata.FromIncomingContext(ctx)
				return len(md.Get("x-internal")) > 0
			}},
		"/grpc.health.v1.Health/*": {Policy: policy(t, "health", 3, 1), Key: key},
		"*":                        {Policy: policy(t, "all", 3, 1), Key: key},
	})
	compare(t, "Check", checkCall(c, withKey("a"), ""), `OK "" retry=- | "check";q=3;w=3 | "check";r=2;t=1 | `)
	compare(t, "Watch", watchCall(c, withKey("a")), `OK "" retry=- | "health";q=3;w=3 | "health";r=2;t=1 | `)
	internal := metadata.AppendToOutgoingContext(context.Background(), "x-internal", "1") // and no key
	compare(t, "exempt Check", checkCall(c, internal, ""), `OK "" retry=- |  |  | `)
	compare(t, "limiter calls", h.lim.calls(), "[a a] [1 1]")

}

// TestRuleMatch: which policy decides each method.
func TestRuleMatch(t *testing.T) {
	key := grpclimit.Metadata("x-client-id")
	rules := grpclimit.Rules{}
	for name, p := range map[string]string{"/a.B/C": "c", "/a.B/*": "b", "/a.B.C/*": "bc", "/x.Y/Z": "z"} {
		rules[name] = grpclimit.Rule{Policy: policy(t, p, 3, 1), Key: key}
	}
	var got string
	lim := limiterFunc(func(_ context.Context, p core.Policy, _ string, _ int64) (core.Result, error) {
		got = p.Name()
		return core.Result{Allowed: true}, nil
	})
	unary := grpclimit.UnaryServerInterceptor(lim, rules)
	withAll := grpclimit.UnaryServerInterceptor(lim, grpclimit.Rules{"*": {Policy: policy(t, "all", 3, 1), Key: key}})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-client-id", "a"))
	noop := func(context.Context, any) (any, error) { return nil, nil }
	for _, tt := range []struct{ method, want string }{
		{"/a.B/C", "c"}, {"/a.B/D", "b"}, {"/a.B.C/D", "bc"}, {"/x.Y/Z", "z"},
		{"/x.Y/W", "none"}, {"/a.Bx/C", "none"}, {"/a.B", "none"}, {"", "none"},
	} {
		got = "none"
		unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: tt.method}, noop)
		compare(t, tt.method, got, tt.want)
		got = "none"
		withAll(ctx, nil, &grpc.UnaryServerInfo{FullMethod: tt.method}, noop)
		compare(t, tt.method+" with *", got, "all")
	}
}

type limiterFunc func(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error)

func (f limiterFunc) AllowN(ctx context.Context, p core.Policy, key string, cost int64) (core.Result, error) {
	return f(ctx, p, key, cost)
}

// TestLimiterErrors: a Limiter's request errors. A bad cost is
// InvalidArgument; a rule it rejects is the server's error, Internal.
func TestLimiterErrors(t *testing.T) {
	p := policy(t, "api", 3, 1)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-client-id", "a"))
	noop := func(context.Context, any) (any, error) { return nil, nil }
	for _, tt := range []struct {
		err  error
		want string
	}{
		{p.CheckCost(0), `InvalidArgument "core: invalid cost: cost 0 must be at least 1" retry=- |  |  | `},
		{p.CheckCost(4), `InvalidArgument "core: cost exceeds policy limit: cost 4 above policy api limit 3" retry=- |  |  | `},
		{fmt.Errorf("%w: no such policy", core.ErrUnknownPolicy), `Internal "internal error" retry=- |  |  | `},
	} {
		lim := limiterFunc(func(context.Context, core.Policy, string, int64) (core.Result, error) { return core.Result{}, tt.err })
		var logs logBuffer
		unary := grpclimit.UnaryServerInterceptor(lim, grpclimit.Rules{"*": {Policy: p, Key: grpclimit.Metadata("x-client-id")}},
			grpclimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		_, err := unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: check}, noop)
		compare(t, tt.err.Error(), outcome(nil, err), tt.want)
		if logged := logs.String() != ""; logged != strings.HasPrefix(tt.want, "Internal") {
			t.Errorf("%v: logged %q", tt.err, logs.String())
		}
	}
}

// TestPanics: interceptors refuse a nil limiter, an incomplete rule and
// a name that is not a method, a service or "*".
func TestPanics(t *testing.T) {
	p := policy(t, "api", 3, 1)
	key := grpclimit.Metadata("x-client-id")
	lim := limiterFunc(func(context.Context, core.Policy, string, int64) (core.Result, error) { return core.Result{}, nil })
	tests := []struct {
		name  string
		lim   grpclimit.Limiter
		rules grpclimit.Rules
		want  string
	}{
		{"nil limiter", nil, nil, "grpclimit: nil Limiter"},
		{"nil key", lim, grpclimit.Rules{"*": {Policy: p}}, "grpclimit: rule *: Key is nil"},
		{"zero policy", lim, grpclimit.Rules{"*": {Key: key}}, "grpclimit: rule *: Policy is the zero Policy"},
	}
	for _, name := range []string{"", "/", "//", "a.B/C", "/a.B", "/a.B/", "/a.B/C/D", "/*", "/*/C", "/a.*/C", "/a.B/C*", "/a.B/**", "**"} {
		tests = append(tests, struct {
			name  string
			lim   grpclimit.Limiter
			rules grpclimit.Rules
			want  string
		}{"name " + name, lim, grpclimit.Rules{name: {Policy: p, Key: key}},
			fmt.Sprintf("grpclimit: rule %q: want \"/package.Service/Method\", \"/package.Service/*\" or \"*\"", name)})
	}
	for _, tt := range tests {
		for kind, build := range map[string]func(){
			"unary":  func() { grpclimit.UnaryServerInterceptor(tt.lim, tt.rules) },
			"stream": func() { grpclimit.StreamServerInterceptor(tt.lim, tt.rules) },
		} {
			t.Run(tt.name+"/"+kind, func(t *testing.T) {
				defer func() {
					if got := fmt.Sprint(recover()); got != tt.want {
						t.Errorf("panic %q, want %q", got, tt.want)
					}
				}()
				build()
			})
		}
	}
}

// TestAlso: a method limited by a bucket of 3 (1/s) and one of 2 (2 a
// day), charged together: 2 calls admitted, then the daily one denies
// and the per-second one is not spent by the denials, as a method on the
// per-second bucket alone shows (1 left of 3). The metadata lists both
// policies; RetryInfo and retry-after are the daily one's.
func TestAlso(t *testing.T) {
	h := newHarness(t)
	sec, day := policy(t, "sec", 3, 1), policy(t, "day", 2, 2.0/86400)
	c := h.serve(t, grpclimit.Rules{
		check:                          {Policy: sec, Also: []core.Policy{day}, Key: grpclimit.Metadata("X-Client-ID")},
		"/grpc.health.v1.Health/Watch": {Policy: sec, Key: grpclimit.Metadata("X-Client-ID")},
	})
	want := []string{
		`OK "" retry=- | "sec";q=3;w=3,"day";q=2;w=86400 | "sec";r=2;t=1,"day";r=1;t=43200 | `,
		`OK "" retry=- | "sec";q=3;w=3,"day";q=2;w=86400 | "sec";r=1;t=2,"day";r=0;t=86400 | `,
		`ResourceExhausted "rate limited by policy \"day\"" retry=12h0m0s | "sec";q=3;w=3,"day";q=2;w=86400 | "sec";r=0;t=3,"day";r=0;t=43200 | 43200`,
		`ResourceExhausted "rate limited by policy \"day\"" retry=12h0m0s | "sec";q=3;w=3,"day";q=2;w=86400 | "sec";r=0;t=3,"day";r=0;t=43200 | 43200`,
	}
	for i, w := range want {
		compare(t, fmt.Sprint("call ", i+1), checkCall(c, withKey("client-a"), ""), w)
	}
	// The per-second bucket was spent by the 2 admitted calls only.
	compare(t, "sec alone", watchCall(c, withKey("client-a")), `OK "" retry=- | "sec";q=3;w=3 | "sec";r=0;t=3 | `)
	if n := h.handled.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
	defer func() {
		if recover() == nil {
			t.Error("Also over a Limiter that is not a MultiDecider did not panic")
		}
	}()
	grpclimit.UnaryServerInterceptor(limiterFunc(nil), grpclimit.Rules{check: {Policy: sec, Also: []core.Policy{day}, Key: grpclimit.Metadata("X-Client-ID")}})
}

package serve_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/internal/redistest"
)

// rlsConfig is the rate limit service's test domain. Its limits are per
// hour or minute, so that the numbers of a test's few requests do not
// depend on how fast the machine runs them.
const rlsConfig = `domain: shop
descriptors:
  - key: client                 # each client 3 an hour (a token bucket: one back every 20 minutes)
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: path
        value: /checkout        # and 2 an hour to /checkout
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: client
    value: vip
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: internal
    rate_limit: {unlimited: true}
  - key: canary
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tier
    value: sw
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 3, outage: fail_closed}
`

// rlsOptions returns serve options for the rate limit service alone,
// with the descriptors of src.
func rlsOptions(t testing.TB, url, src string) serve.Options {
	t.Helper()
	o := options(t, url, testConfig)
	o.Config = ""
	o.RLSConfig = filepath.Join(t.TempDir(), "rls.yaml")
	o.GRPCListen = "127.0.0.1:0"
	if err := os.WriteFile(o.RLSConfig, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return o
}

// serveRLS serves a's rate limit service on a loopback port and returns a
// client connection to it.
func serveRLS(t testing.TB, a *serve.App) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := a.GRPCServer()
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func override(d *rlcommon.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

func hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// show renders a response: the overall code, each status as
// code[/limit per unit] r=remaining t=seconds until reset (rounded up),
// and the headers to add.
func show(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, st := range r.GetStatuses() {
		fmt.Fprintf(&b, " [%s", st.GetCode())
		if l := st.GetCurrentLimit(); l != nil {
			fmt.Fprintf(&b, " %d/%s", l.GetRequestsPerUnit(), l.GetUnit())
		}
		if st.GetLimitRemaining() != 0 || st.GetCurrentLimit() != nil {
			fmt.Fprintf(&b, " r=%d", st.GetLimitRemaining())
		}
		if d := st.GetDurationUntilReset(); d != nil {
			fmt.Fprintf(&b, " t=%d", (d.AsDuration()+time.Second-1)/time.Second)
		}
		b.WriteString("]")
	}
	for _, h := range r.GetResponseHeadersToAdd() {
		fmt.Fprintf(&b, " | %s: %s", h.GetKey(), h.GetValue())
	}
	for _, h := range r.GetRequestHeadersToAdd() {
		fmt.Fprintf(&b, " | upstream %s: %s", h.GetKey(), h.GetValue())
	}
	return b.String()
}

// TestRLSResponses asks the rate limit service through a real gRPC client
// on loopback and compares whole responses: defaults, values, nested
// descriptors, unlimited, shadow mode, hits_addend, several descriptors
// charged all or nothing, a zero limit, a cost above the limit, an
// unknown domain, and malformed requests that spend nothing.
func TestRLSResponses(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newApp(t, rlsOptions(t, srv.URL(), rlsConfig))
	cc := serveRLS(t, a)
	rl := rlsv3.NewRateLimitServiceClient(cc)
	ask := func(domain string, hitsAddend uint32, ds ...*rlcommon.RateLimitDescriptor) string {
		t.Helper()
		r, err := rl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hitsAddend})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return show(r)
	}
	const (
		cl  = ` | RateLimit-Policy: "shop.client";q=3;w=3600`
		nst = `"shop.client.path__checkout-ce6242a9";q=2;w=3600`
		ovr = "9dfb56bc"
	)
	steps := []struct {
		what string
		got  func() string
		want string
	}{
		{"a client by default", func() string { return ask("shop", 0, desc("client", "alice")) },
			`OK [OK 3/HOUR r=2 t=1200]` + cl + ` | RateLimit: "shop.client";r=2;t=1200`},
		{"again", func() string { return ask("shop", 0, desc("client", "alice")) },
			`OK [OK 3/HOUR r=1 t=2400]` + cl + ` | RateLimit: "shop.client";r=1;t=2400`},
		{"the last", func() string { return ask("shop", 0, desc("client", "alice")) },
			`OK [OK 3/HOUR r=0 t=3600]` + cl + ` | RateLimit: "shop.client";r=0;t=3600`},
		{"over the limit", func() string { return ask("shop", 0, desc("client", "alice")) },
			`OVER_LIMIT [OVER_LIMIT 3/HOUR r=0 t=1200]` + cl + ` | RateLimit: "shop.client";r=0;t=1200 | Retry-After: 1200`},
		{"a value's own limit", func() string { return ask("shop", 0, desc("client", "vip")) },
			`OK [OK 10/HOUR r=9 t=360] | RateLimit-Policy: "shop.client_vip";q=10;w=3600 | RateLimit: "shop.client_vip";r=9;t=360`},
		{"nested", func() string { return ask("shop", 0, desc("client", "bob", "path", "/checkout")) },
			`OK [OK 2/HOUR r=1 t=1800] | RateLimit-Policy: ` + nst + ` | RateLimit: "shop.client.path__checkout-ce6242a9";r=1;t=1800`},
		{"nested, no such value", func() string { return ask("shop", 0, desc("client", "bob", "path", "/other")) }, `OK [OK]`},
		{"deeper than the tree", func() string { return ask("shop", 0, desc("client", "bob", "path", "/checkout", "x", "y")) }, `OK [OK]`},
		{"the request's hits_addend", func() string { return ask("shop", 2, desc("client", "carol")) },
			`OK [OK 3/HOUR r=1 t=2400]` + cl + ` | RateLimit: "shop.client";r=1;t=2400`},
		{"a descriptor's hits_addend 0 checks (t: full after one more)", func() string { return ask("shop", 0, hits(desc("client", "carol"), 0)) },
			`OK [OK 3/HOUR r=1 t=3600]` + cl + ` | RateLimit: "shop.client";r=1;t=3600`},
		{"a descriptor's hits_addend above what is left", func() string { return ask("shop", 1, hits(desc("client", "carol"), 2)) },
			`OVER_LIMIT [OVER_LIMIT 3/HOUR r=1 t=1200]` + cl + ` | RateLimit: "shop.client";r=1;t=1200 | Retry-After: 1200`},
		{"unlimited", func() string { return ask("shop", 0, desc("internal", "x")) }, `OK [OK r=4294967295]`},
		{"shadow mode", func() string { return ask("shop", 0, desc("canary", "c")) }, `OK [OK 1/HOUR r=0 t=3600]`},
		{"shadow mode over the limit", func() string { return ask("shop", 0, desc("canary", "c")) }, `OK [OK 1/HOUR r=0 t=3600]`},
		{"two limits, both admit", func() string {
			return ask("shop", 0, desc("client", "dave"), desc("client", "dave", "path", "/checkout"))
		},
			`OK [OK 3/HOUR r=2 t=1200] [OK 2/HOUR r=1 t=1800] | RateLimit-Policy: "shop.client";q=3;w=3600, ` + nst + ` | RateLimit: "shop.client";r=2;t=1200, "shop.client.path__checkout-ce6242a9";r=1;t=1800`},
		{"again", func() string {
			return ask("shop", 0, desc("client", "dave"), desc("client", "dave", "path", "/checkout"))
		},
			`OK [OK 3/HOUR r=1 t=2400] [OK 2/HOUR r=0 t=3600] | RateLimit-Policy: "shop.client";q=3;w=3600, ` + nst + ` | RateLimit: "shop.client";r=1;t=2400, "shop.client.path__checkout-ce6242a9";r=0;t=3600`},
		{"one over: none spent", func() string {
			return ask("shop", 0, desc("client", "dave"), desc("client", "dave", "path", "/checkout"))
		},
			`OVER_LIMIT [OK 3/HOUR r=0 t=3600] [OVER_LIMIT 2/HOUR r=0 t=1800] | RateLimit-Policy: "shop.client";q=3;w=3600, ` + nst + ` | RateLimit: "shop.client";r=0;t=3600, "shop.client.path__checkout-ce6242a9";r=0;t=1800 | Retry-After: 1800`},
		{"the first was refunded", func() string { return ask("shop", 0, desc("client", "dave")) },
			`OK [OK 3/HOUR r=0 t=3600]` + cl + ` | RateLimit: "shop.client";r=0;t=3600`},
		{"a zero limit, with another: nothing spent", func() string { return ask("shop", 0, desc("client", "erin"), desc("blocked", "x")) },
			`OVER_LIMIT [OK 3/HOUR r=2 t=1200] [OVER_LIMIT 0/MINUTE r=0 t=60]` + cl + ` | RateLimit: "shop.client";r=2;t=1200 | Retry-After: 60`},
		{"a check of a zero limit", func() string { return ask("shop", 0, hits(desc("blocked", "x"), 0)) }, `OK [OK 0/MINUTE r=0 t=60]`},
		{"erin untouched", func() string { return ask("shop", 0, desc("client", "erin")) },
			`OK [OK 3/HOUR r=2 t=1200]` + cl + ` | RateLimit: "shop.client";r=2;t=1200`},
		{"a cost above the limit", func() string { return ask("shop", 5, desc("client", "frank")) },
			`OVER_LIMIT [OVER_LIMIT 3/HOUR r=0 t=3600] | Retry-After: 3600`},
		{"frank untouched", func() string { return ask("shop", 0, desc("client", "frank")) },
			`OK [OK 3/HOUR r=2 t=1200]` + cl + ` | RateLimit: "shop.client";r=2;t=1200`},
		{"an unmatched descriptor beside a limited one", func() string { return ask("shop", 0, desc("nothing", "here"), desc("client", "frank")) },
			`OK [OK] [OK 3/HOUR r=1 t=2400]` + cl + ` | RateLimit: "shop.client";r=1;t=2400`},
		{"sliding window", func() string { return ask("shop", 0, desc("tier", "sw")) },
			`OK [OK 2/MINUTE r=1 t=60] | RateLimit-Policy: "shop.tier_sw";q=2;w=60 | RateLimit: "shop.tier_sw";r=1;t=60`},
		{"an unknown domain", func() string { return ask("elsewhere", 0, desc("client", "alice")) }, `OK [OK]`},
		{"Envoy's limit override", func() string { return ask("shop", 0, override(desc("client", "olga"), 2, typev3.RateLimitUnit_MINUTE)) },
			`OK [OK 2/MINUTE r=1 t=30] | RateLimit-Policy: "override-` + ovr + `";q=2;w=60 | RateLimit: "override-` + ovr + `";r=1;t=30`},
		{"the override again", func() string { return ask("shop", 0, override(desc("client", "olga"), 2, typev3.RateLimitUnit_MINUTE)) },
			`OK [OK 2/MINUTE r=0 t=60] | RateLimit-Policy: "override-` + ovr + `";q=2;w=60 | RateLimit: "override-` + ovr + `";r=0;t=60`},
		{"over the override", func() string { return ask("shop", 0, override(desc("client", "olga"), 2, typev3.RateLimitUnit_MINUTE)) },
			`OVER_LIMIT [OVER_LIMIT 2/MINUTE r=0 t=30] | RateLimit-Policy: "override-` + ovr + `";q=2;w=60 | RateLimit: "override-` + ovr + `";r=0;t=30 | Retry-After: 30`},
		{"the config's limit untouched by the override", func() string { return ask("shop", 0, desc("client", "olga")) },
			`OK [OK 3/HOUR r=2 t=1200]` + cl + ` | RateLimit: "shop.client";r=2;t=1200`},
	}
	for i, s := range steps {
		if got := s.got(); got != s.want {
			t.Errorf("%d %s:\n got  %s\n want %s", i+1, s.what, got, s.want)
		}
	}

	// Malformed requests: InvalidArgument with a message that says why,
	// and nothing spent, even of a good descriptor beside the bad one.
	long := strings.Repeat("v", 257)
	neg := desc("client", "gina")
	neg.IsNegativeHits = true
	for _, tt := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "gina")}}, "empty domain"},
		{&rlsv3.RateLimitRequest{Domain: "shop"}, "no descriptors"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "gina"), {}}}, "descriptor 1 has no entries"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "gina"), desc("", "x")}}, "descriptor 1 entry 0 has an empty key"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "gina"), desc("client", long)}}, "longer than 256 bytes"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{neg}}, "is_negative_hits is not supported"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "gina"), override(desc("client", "gina"), 1, typev3.RateLimitUnit_UNKNOWN)}}, "a limit override with unit 0"},
	} {
		_, err := rl.ShouldRateLimit(context.Background(), tt.req)
		if grpcstatus.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want InvalidArgument with %q", tt.req, err, tt.want)
		}
	}
	if got, want := ask("shop", 0, desc("client", "gina")), `OK [OK 3/HOUR r=2 t=1200]`+cl+` | RateLimit: "shop.client";r=2;t=1200`; got != want {
		t.Errorf("after the malformed requests:\n got  %s\n want %s", got, want)
	}

	// Health: serving, the service and the server.
	hc := healthpb.NewHealthClient(cc)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, r, err)
		}
	}

	// Metrics by domain and descriptor keys, never a value.
	m := get(a.Handler(), "/metrics", "").Body.String()
	for _, want := range []string{
		`holdfast_rls_descriptors_total{descriptor="client",domain="shop",mode="redis",result="ok"} 18`,
		`holdfast_rls_descriptors_total{descriptor="client",domain="shop",mode="redis",result="over_limit"} 3`,
		`holdfast_rls_descriptors_total{descriptor="canary",domain="shop",mode="redis",result="shadow_over_limit"} 1`,
		`holdfast_rls_descriptors_total{descriptor="internal",domain="shop",mode="none",result="unlimited"} 1`,
		`holdfast_rls_descriptors_total{descriptor="",domain="unknown",mode="none",result="unmatched"} 1`,
		`holdfast_rls_requests_total{code="invalid_argument",domain=""} 7`,
		`holdfast_decisions_total{mode="redis",policy="shop.client",result="allowed"}`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
			for _, line := range strings.Split(m, "\n") {
				if strings.HasPrefix(line, "holdfast_rls") {
					t.Log(line)
				}
			}
		}
	}
	for _, value := range []string{"alice", "dave", "/checkout", "elsewhere"} {
		if strings.Contains(m, value) {
			t.Errorf("/metrics shows the descriptor value or domain %q", value)
		}
	}
	if st := a.Status(); strings.Join(st.RLSDomains, ",") != "shop" {
		t.Errorf("/status rls_domains %v", st.RLSDomains)
	}

	// A key Redis cannot decide (it holds another type): the limit's
	// outage mode decides, marked; here leases, so fail_open.
	srv.Do(t, "LPUSH", "hf:{shop.client:5:wrong}", "x")
	if got, want := ask("shop", 0, desc("client", "wrong")), `OK [OK 3/HOUR r=3 t=0]`+cl+` | RateLimit: "shop.client";r=3;t=0 | x-holdfast-mode: fail_open | upstream x-holdfast-mode: fail_open`; got != want {
		t.Errorf("a key of the wrong type:\n got  %s\n want %s", got, want)
	}
	srv.Do(t, "LPUSH", "hf:{shop.strict:5:wrong}", "x")
	if got, want := ask("shop", 0, desc("strict", "wrong")), `OVER_LIMIT [OVER_LIMIT 3/HOUR r=0 t=1] | RateLimit-Policy: "shop.strict";q=3;w=3600 | RateLimit: "shop.strict";r=0;t=1 | Retry-After: 1 | x-holdfast-mode: fail_closed | upstream x-holdfast-mode: fail_closed`; got != want {
		t.Errorf("a fail_closed key of the wrong type:\n got  %s\n want %s", got, want)
	}

	// Redis gone: still OK or OVER_LIMIT, decided locally, and marked.
	srv.Kill()
	for i, want := range []string{
		`OK [OK 3/HOUR r=2 t=1200]` + cl + ` | RateLimit: "shop.client";r=2;t=1200 | x-holdfast-mode: local | upstream x-holdfast-mode: local`,
		`OK [OK 3/HOUR r=1 t=2400]` + cl + ` | RateLimit: "shop.client";r=1;t=2400 | x-holdfast-mode: local | upstream x-holdfast-mode: local`,
	} {
		if got := ask("shop", 0, desc("client", "zed")); got != want {
			t.Errorf("outage request %d:\n got  %s\n want %s", i+1, got, want)
		}
	}
}

// TestRLSReadmeExamples serves envoyproxy/ratelimit's README examples
// (retyped as rls/testdata/readme, loaded unchanged from the directory)
// and asks what the README says of each. Per-second limits are token
// buckets refilling while the test runs, so their admitted counts are
// checked against the bound: the limit plus what refilled meanwhile.
func TestRLSReadmeExamples(t *testing.T) {
	srv := redistest.Start(t)
	o := rlsOptions(t, srv.URL(), rlsConfig)
	o.RLSConfig = "rls/testdata/readme"
	a, _ := newApp(t, o)
	rl := rlsv3.NewRateLimitServiceClient(serveRLS(t, a))
	call := func(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := rl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
		if err != nil {
			t.Fatalf("%s: %v", domain, err)
		}
		return r
	}
	// burst asks n times at once and returns the OKs and the bound of a
	// limit per second over the time taken.
	burst := func(n int, limit float64, domain string, ds ...*rlcommon.RateLimitDescriptor) (int, int) {
		t.Helper()
		start, oks := time.Now(), 0
		for range n {
			if call(domain, ds...).GetOverallCode() == rlsv3.RateLimitResponse_OK {
				oks++
			}
		}
		return oks, int(limit) + int(time.Since(start).Seconds()*limit) + 1
	}
	expect := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s:\n got  %s\n want %s", what, got, want)
		}
	}
	statuses := func(r *rlsv3.RateLimitResponse) string {
		s := show(r)
		if i := strings.Index(s, " |"); i >= 0 {
			s = s[:i]
		}
		return s
	}

	// Example 1: database users and default, 500 a second each; another
	// database is not limited.
	expect("example 1 users", statuses(call("mongo_cps", desc("database", "users"))), "OK [OK 500/SECOND r=499 t=1]")
	expect("example 1 orders", statuses(call("mongo_cps", desc("database", "orders"))), "OK [OK]")

	// Example 2: the README's complete request, both descriptors: 5
	// marketing messages a day to the number, then OVER_LIMIT, and the
	// denied ones spend nothing of the 100 a day.
	both := []*rlcommon.RateLimitDescriptor{desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111")}
	for i := range 5 {
		if r := call("messaging", both...); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[1].GetLimitRemaining() != uint32(99-i) {
			t.Errorf("example 2 message %d: %s", i+1, statuses(r))
		}
	}
	r := call("messaging", both...)
	expect("example 2 the sixth", statuses(r)[:strings.Index(statuses(r), " t=")], "OVER_LIMIT [OVER_LIMIT 5/DAY r=0")
	expect("example 2 to another number", statuses(call("messaging", desc("to_number", "2062222222"))), "OK [OK 100/DAY r=99 t=864]")
	if r := call("messaging", desc("to_number", "2061111111")); r.GetStatuses()[0].GetLimitRemaining() != 94 {
		t.Errorf("example 2: the sixth spent of the 100 a day: %s", statuses(r))
	}

	// Example 3: 10 a second for each address, 50.0.0.5 never.
	if oks, bound := burst(30, 10, "edge_proxy_per_ip", desc("remote_address", "50.0.0.1")); oks < 10 || oks > bound {
		t.Errorf("example 3: %d of 30 admitted, want 10 to %d", oks, bound)
	}
	expect("example 3 blacklisted", statuses(call("edge_proxy_per_ip", desc("remote_address", "50.0.0.5"))), "OVER_LIMIT [OVER_LIMIT 0/SECOND r=0 t=1]")

	// Example 4: a two-entry descriptor matches the nested config only.
	expect("example 4 nested", statuses(call("example4", desc("key", "value", "subkey", "subvalue"))), "OK [OK 300/SECOND r=299 t=1]")
	expect("example 4 shallow", statuses(call("example4_shallow", desc("key", "value", "subkey", "subvalue"))), "OK [OK]")

	// Example 5: ldap unlimited (limit_remaining MaxUint32), azure 100 a minute.
	expect("example 5 ldap", statuses(call("internal", desc("ldap", "x"))), "OK [OK r=4294967295]")
	expect("example 5 azure", statuses(call("internal", desc("azure", "x"))), "OK [OK 100/MINUTE r=99 t=1]")

	// Example 6: user-a in shadow mode is never limited, user-b at 20 a second.
	if oks, _ := burst(40, 10, "example6", desc("service", "auth-service", "user", "user-a")); oks != 40 {
		t.Errorf("example 6 user-a: %d of 40 OK, want all", oks)
	}
	if oks, bound := burst(40, 20, "example6", desc("service", "auth-service", "user", "user-b")); oks < 20 || oks > bound {
		t.Errorf("example 6 user-b: %d of 40 admitted, want 20 to %d", oks, bound)
	}

	// Example 7: with both descriptors the 10 a second replaces the 5.
	ex7 := []*rlcommon.RateLimitDescriptor{desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")}
	expect("example 7 both", statuses(call("example7", ex7...)), "OK [OK] [OK 10/SECOND r=9 t=1]")
	if oks, bound := burst(30, 10, "example7", ex7...); oks < 9 || oks > bound {
		t.Errorf("example 7: %d of 30 admitted after one, want 9 to %d", oks, bound)
	}
	expect("example 7 alone, untouched", statuses(call("example7", desc("key_1", "value_1", "user", "bkthomps"))), "OK [OK 5/SECOND r=4 t=1]")

	// Example 9: wildcards; each matching value its own 20 a minute.
	expect("example 9 value1", statuses(call("example9", desc("key1", "value1"))), "OK [OK 20/MINUTE r=19 t=3]")
	expect("example 9 valueXYZ", statuses(call("example9", desc("key1", "valueXYZ"))), "OK [OK 20/MINUTE r=19 t=3]")
	expect("example 9 middle", statuses(call("example9", desc("path", "/api/123/action"))), "OK [OK 20/MINUTE r=19 t=3]")
	expect("example 9 no match", statuses(call("example9", desc("path", "/api/123/other"))), "OK [OK]")

	// Example 11: files/* share 10 an hour; files_no_share/* each have 10.
	for range 5 {
		call("example11", desc("files", "files/a.pdf"))
		call("example11", desc("files", "files/b.csv"))
		call("example11", desc("files_no_share", "files_no_share/a.pdf"))
		call("example11", desc("files_no_share", "files_no_share/a.pdf"))
	}
	expect("example 11 shared", statuses(call("example11", desc("files", "files/c.txt")))[:10], "OVER_LIMIT")
	expect("example 11 not shared", statuses(call("example11", desc("files_no_share", "files_no_share/b.csv"))), "OK [OK 10/HOUR r=9 t=360]")
}

// TestRLSRun runs serve as the binary does, with the rate limit service
// alone: it logs its gRPC address and domains, answers health and
// ShouldRateLimit there, and stops cleanly when cancelled.
func TestRLSRun(t *testing.T) {
	srv := redistest.Start(t)
	o := rlsOptions(t, srv.URL(), rlsConfig)
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve.Run(ctx, o, slog.New(slog.NewTextHandler(logs, nil))) }()
	addr := regexp.MustCompile(`msg="holdfast serve grpc listening" addr=(\S+) domains=shop`)
	var target string
	for deadline := time.Now().Add(10 * time.Second); target == ""; time.Sleep(20 * time.Millisecond) {
		if m := addr.FindStringSubmatch(logs.String()); m != nil {
			target = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not log its gRPC address:\n%s", logs)
		}
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if r, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", r, err)
	}
	r, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "run")}})
	if err != nil || show(r) != `OK [OK 3/HOUR r=2 t=1200] | RateLimit-Policy: "shop.client";q=3;w=3600 | RateLimit: "shop.client";r=2;t=1200` {
		t.Errorf("ShouldRateLimit: %v %v", r, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after cancel")
	}
	if !strings.Contains(logs.String(), "holdfast serve stopped") {
		t.Errorf("logs:\n%s", logs)
	}
}

// TestRLSOnCluster: on a 3-master Redis Cluster a request's descriptors
// live in different slots, and are still charged all or nothing.
func TestRLSOnCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	a, _ := newApp(t, rlsOptions(t, c.URL(), rlsConfig))
	waitStatus(t, a.Handler(), 10*time.Second, "3 shards", func(st serve.Status) bool { return len(st.Shards) == 3 })
	rl := rlsv3.NewRateLimitServiceClient(serveRLS(t, a))
	var got []string
	for range 4 {
		r, err := rl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "kim"), desc("client", "kim", "path", "/checkout"), desc("client", "vip")}})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.SplitN(show(r), " |", 2)[0])
	}
	want := []string{
		"OK [OK 3/HOUR r=2 t=1200] [OK 2/HOUR r=1 t=1800] [OK 10/HOUR r=9 t=360]",
		"OK [OK 3/HOUR r=1 t=2400] [OK 2/HOUR r=0 t=3600] [OK 10/HOUR r=8 t=720]",
		// The checkout limit denies: the first is refunded in its shard,
		// the last only peeked in its (what it would leave: 7).
		"OVER_LIMIT [OK 3/HOUR r=0 t=3600] [OVER_LIMIT 2/HOUR r=0 t=1800] [OK 10/HOUR r=7 t=1080]",
		"OVER_LIMIT [OK 3/HOUR r=0 t=3600] [OVER_LIMIT 2/HOUR r=0 t=1800] [OK 10/HOUR r=7 t=1080]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Nothing of the denied requests was spent.
	r, err := rl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "kim"), desc("client", "vip")}})
	if err != nil || !strings.HasPrefix(show(r), "OK [OK 3/HOUR r=0 t=3600] [OK 10/HOUR r=7 t=1080]") {
		t.Errorf("after the denials: %v %v", show(r), err)
	}
}

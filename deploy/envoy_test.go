package deploy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/cmd/demo/serve/rls"
	"github.com/holdfast/holdfast/internal/redistest"
)

// No Envoy binary can be had on this machine (Debian has no package and
// Envoy's own installers download it), so envoy.yaml and
// envoy-compose.yml are checked as the nginx files are: their parts agree
// with each other and with serve's flags, and what Envoy would send for
// a request, built from envoy.yaml's rate_limits actions, is asked of a
// real rate limit service loaded with deploy/rls.yaml.

const (
	rlsConfigPath = "/etc/holdfast/rls.yaml"
	rlsPort       = "8081"
)

var rlsApps = []string{"rls1", "rls2"}

// envoyConf is deploy/envoy.yaml as a tree.
func envoyConf(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(read(t, "envoy.yaml")), &m); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	return m
}

// at follows a path of map keys and list indexes through a YAML tree.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("envoy.yaml: no mapping at %v (looking for %q)", path, k)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("envoy.yaml: no list item %d at %v", k, path)
			}
			v = l[k]
		}
	}
	return v
}

// envoyParts are the parts of envoy.yaml the tests read: the rate limit
// filter, the route's rate_limits and the clusters by name.
func envoyParts(t *testing.T) (filter map[string]any, rateLimits []any, clusters map[string]map[string]any) {
	t.Helper()
	c := envoyConf(t)
	hcm := at(t, c, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	for _, f := range at(t, hcm, "http_filters").([]any) {
		if at(t, f, "name") == "envoy.filters.http.ratelimit" {
			filter = at(t, f, "typed_config").(map[string]any)
		}
	}
	if filter == nil {
		t.Fatal("envoy.yaml has no envoy.filters.http.ratelimit filter")
	}
	rateLimits, _ = at(t, hcm, "route_config", "virtual_hosts", 0, "routes", 0, "route", "rate_limits").([]any)
	clusters = map[string]map[string]any{}
	for _, cl := range at(t, c, "static_resources", "clusters").([]any) {
		clusters[at(t, cl, "name").(string)] = cl.(map[string]any)
	}
	return filter, rateLimits, clusters
}

// descriptorsFor builds the descriptors Envoy sends for a request with
// headers h, from rate_limits actions of request_headers: one descriptor a
// rate_limits entry, none when a header is absent.
func descriptorsFor(t *testing.T, rateLimits []any, h map[string]string) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	var ds []*rlcommon.RateLimitDescriptor
	for _, rl := range rateLimits {
		d := &rlcommon.RateLimitDescriptor{}
		for _, a := range at(t, rl, "actions").([]any) {
			rh, ok := at(t, a, "request_headers").(map[string]any)
			if !ok {
				t.Fatalf("envoy.yaml: action %v: the test reads only request_headers actions", a)
			}
			v, ok := h[rh["header_name"].(string)]
			if !ok {
				d = nil
				break
			}
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: rh["descriptor_key"].(string), Value: v})
		}
		if d != nil {
			ds = append(ds, d)
		}
	}
	return ds
}

func TestEnvoyConf(t *testing.T) {
	filter, rateLimits, clusters := envoyParts(t)
	cfg, err := rls.LoadPath("rls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := filter["domain"].(string); !slices.Contains(cfg.Domains(), d) {
		t.Errorf("envoy.yaml's rate limit domain %v is not rls.yaml's %v", d, cfg.Domains())
	}
	svc := at(t, filter, "rate_limit_service").(map[string]any)
	if at(t, svc, "transport_api_version") != "V3" {
		t.Error("envoy.yaml: rate_limit_service.transport_api_version is not V3")
	}
	name := at(t, svc, "grpc_service", "envoy_grpc", "cluster_name").(string)
	cl := clusters[name]
	if cl == nil {
		t.Fatalf("envoy.yaml: rate limit cluster %q is not defined", name)
	}
	if at(t, cl, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "explicit_http_config", "http2_protocol_options") == nil {
		t.Errorf("envoy.yaml: cluster %s does not speak HTTP/2, which gRPC needs", name)
	}
	if s := at(t, cl, "health_checks", 0, "grpc_health_check", "service_name"); s != rlsv3.RateLimitService_ServiceDesc.ServiceName {
		t.Errorf("envoy.yaml: cluster %s health checks %v, want the gRPC health of %s", name, s, rlsv3.RateLimitService_ServiceDesc.ServiceName)
	}
	var eps []string
	for _, e := range at(t, cl, "load_assignment", "endpoints", 0, "lb_endpoints").([]any) {
		sa := at(t, e, "endpoint", "address", "socket_address")
		eps = append(eps, fmt.Sprintf("%v:%v", at(t, sa, "address"), at(t, sa, "port_value")))
	}
	var want []string
	for _, app := range rlsApps {
		want = append(want, app+":"+rlsPort)
	}
	if !slices.Equal(eps, want) {
		t.Errorf("envoy.yaml: rate limit endpoints %v, want %v", eps, want)
	}
	// Envoy waits longer than holdfast may take: one call deadline a
	// descriptor (serve's default --call-timeout, 50ms).
	timeout, err := time.ParseDuration(filter["timeout"].(string))
	if err != nil || timeout < time.Duration(len(rateLimits))*2*50*time.Millisecond {
		t.Errorf("envoy.yaml: rate limit timeout %v: want at least twice the call deadline for each of %d descriptors", filter["timeout"], len(rateLimits))
	}
	if filter["failure_mode_deny"] != false {
		t.Error("envoy.yaml: failure_mode_deny should be false (holdfast answers through Redis outages itself)")
	}
	if up := clusters["upstream"]; up == nil {
		t.Error("envoy.yaml: no upstream cluster")
	}
	if got := descriptorsFor(t, rateLimits, map[string]string{"x-client-id": "alice", ":path": "/"}); len(got) != 2 {
		t.Errorf("envoy.yaml sends %d descriptors for a client's request, want 2", len(got))
	}
}

// envoyCompose is the part of envoy-compose.yml the tests read.
type envoyCompose struct {
	Services map[string]struct {
		Image     string   `yaml:"image"`
		Command   []string `yaml:"command"`
		Volumes   []string `yaml:"volumes"`
		Ports     []string `yaml:"ports"`
		DependsOn []string `yaml:"depends_on"`
		Build     struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func TestEnvoyCompose(t *testing.T) {
	clearServeEnv(t)
	var c envoyCompose
	if err := yaml.Unmarshal([]byte(read(t, "envoy-compose.yml")), &c); err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range c.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"envoy", "redis", "rls1", "rls2", "upstream"}) {
		t.Errorf("services %v", names)
	}
	for _, app := range rlsApps {
		s := c.Services[app]
		if len(s.Command) == 0 || s.Command[0] != "serve" {
			t.Errorf("%s: command %v does not start with serve", app, s.Command)
			continue
		}
		o, err := serve.Parse(s.Command[1:], io.Discard)
		if err != nil {
			t.Errorf("%s: serve rejects its command: %v", app, err)
			continue
		}
		for _, ch := range []struct {
			what      string
			got, want any
		}{
			{"--id", o.ID, app},
			{"--grpc-listen", o.GRPCListen, ":" + rlsPort},
			{"--rls-config", o.RLSConfig, rlsConfigPath},
			{"--state-dir", o.StateDir, stateDir},
			{"--expected-instances", o.ExpectedInstances, len(rlsApps)},
			{"rls.yaml mounted", slices.Contains(s.Volumes, "./rls.yaml:"+rlsConfigPath+":ro"), true},
			{"state volume", slices.Contains(s.Volumes, app+"-state:"+stateDir) && hasKey(c.Volumes, app+"-state"), true},
			{"build", s.Build.Context + " " + s.Build.Dockerfile, ".. deploy/Dockerfile"},
			{"depends on redis", slices.Contains(s.DependsOn, "redis"), true},
		} {
			if ch.got != ch.want {
				t.Errorf("%s: %s = %v, want %v", app, ch.what, ch.got, ch.want)
			}
		}
	}
	e := c.Services["envoy"]
	if !strings.HasPrefix(e.Image, "envoyproxy/envoy:") || !slices.Contains(e.Volumes, "./envoy.yaml:/etc/envoy/envoy.yaml:ro") ||
		!slices.Contains(e.Ports, "10000:10000") || strings.Join(e.Command, " ") != "envoy -c /etc/envoy/envoy.yaml" {
		t.Errorf("envoy service %+v", e)
	}
	for _, dep := range append([]string{"upstream"}, rlsApps...) {
		if !slices.Contains(e.DependsOn, dep) {
			t.Errorf("envoy does not depend on %s", dep)
		}
	}
	// envoy.yaml's upstream cluster is the compose service.
	_, _, clusters := envoyParts(t)
	sa := at(t, clusters["upstream"], "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
	if at(t, sa, "address") != "upstream" || !strings.Contains(strings.Join(c.Services["upstream"].Command, " "), fmt.Sprintf(":%v", at(t, sa, "port_value"))) {
		t.Errorf("envoy.yaml's upstream %v is not the upstream service's %v", sa, c.Services["upstream"].Command)
	}
	// The rate limit service listens where envoy.yaml's listener sends to.
	if l := at(t, envoyConf(t), "static_resources", "listeners", 0, "address", "socket_address", "port_value"); fmt.Sprint(l) != "10000" {
		t.Errorf("envoy.yaml listens on %v, the compose file publishes 10000", l)
	}
}

// TestEnvoyRequestsDecide asks a rate limit service loaded with
// deploy/rls.yaml what envoy.yaml's actions send for a client's requests:
// (client) at 10 a second, (client, path /expensive) at 5 a minute,
// charged together, and the unlimited internal client.
func TestEnvoyRequestsDecide(t *testing.T) {
	srv := redistest.Start(t)
	clearServeEnv(t)
	o, err := serve.Parse([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--redis", srv.URL(), "--rls-config", "rls.yaml",
		"--state-dir", t.TempDir(), "--call-timeout", "300ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a, err := serve.New(context.Background(), *o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go a.GRPCServer().Serve(ln)
	defer a.GRPCServer().Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rl := rlsv3.NewRateLimitServiceClient(cc)
	filter, rateLimits, _ := envoyParts(t)
	ask := func(h map[string]string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		r, err := rl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: filter["domain"].(string), Descriptors: descriptorsFor(t, rateLimits, h)})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOverallCode()
	}
	var codes []string
	for range 7 {
		codes = append(codes, ask(map[string]string{"x-client-id": "alice", ":path": "/expensive"}).String())
	}
	if got := strings.Join(codes, " "); got != "OK OK OK OK OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("alice's /expensive: %s, want 5 OK then OVER_LIMIT", got)
	}
	for i := range 20 {
		if c := ask(map[string]string{"x-client-id": "internal-batch", ":path": "/expensive"}); c != rlsv3.RateLimitResponse_OK {
			t.Errorf("internal-batch request %d: %v", i+1, c)
		}
	}
	// Without X-Client-ID no descriptor is built, and Envoy does not ask.
	if ds := descriptorsFor(t, rateLimits, map[string]string{":path": "/"}); len(ds) != 0 {
		t.Errorf("a request without X-Client-ID sends %d descriptors", len(ds))
	}
}

package serve_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/internal/redistest"
)

const password = "s3cr3t-pa55word"

// TestRunShutsDownGracefully runs serve as the binary does, against a Redis
// with a password: the logs never show the password; after an outage with
// grants pending, cancelling (SIGTERM in the binary) stops the server and
// closes the limiter, which writes the outage log to the state dir.
func TestRunShutsDownGracefully(t *testing.T) {
	srv := redistest.Start(t, redistest.WithPassword(password))
	o := options(t, srv.URL(), testConfig)
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve.Run(ctx, o, slog.New(slog.NewTextHandler(logs, nil))) }()

	addr := regexp.MustCompile(`msg="holdfast serve listening" addr=(\S+)`)
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == ""; time.Sleep(20 * time.Millisecond) {
		if m := addr.FindStringSubmatch(logs.String()); m != nil {
			base = "http://" + m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", logs)
		}
	}
	get := func(path string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("X-Client-ID", "c1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/api/tb"); code != 200 {
		t.Fatalf("/api/tb: %d %s", code, body)
	}
	srv.Kill()
	for range 5 {
		get("/api/sw")
	}
	_, st := get("/status")
	if !strings.Contains(st, `"breaker":"open"`) || strings.Contains(st, password) || strings.Contains(st, "redis://") {
		t.Errorf("/status during the outage: %s", st)
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
	saved, _ := filepath.Glob(filepath.Join(o.StateDir, "*.journal"))
	if len(saved) != 1 {
		t.Errorf("state dir holds %v, want the saved outage log", saved)
	}
	out := logs.String()
	if strings.Contains(out, password) {
		t.Errorf("the logs show the Redis password:\n%s", out)
	}
	for _, want := range []string{"redis=redis://:xxxxx@", "holdfast serve shutting down", "holdfast saved outage log", "holdfast serve stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

func TestParseFlagsAndEnvironment(t *testing.T) {
	t.Setenv("HOLDFAST_LISTEN", "127.0.0.1:9999")
	t.Setenv("HOLDFAST_CONFIG", "/etc/holdfast.yaml")
	t.Setenv("HOLDFAST_CALL_TIMEOUT", "80ms")
	t.Setenv("HOLDFAST_EXPECTED_INSTANCES", "4")
	o, err := serve.Parse([]string{"--listen", ":8080", "--backend", "rueidis", "--id", "app2", "--state-dir", "/var/lib/holdfast"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Listen != ":8080" || o.Config != "/etc/holdfast.yaml" || o.CallTimeout != 80*time.Millisecond ||
		o.ExpectedInstances != 4 || o.Backend != "rueidis" || o.ID != "app2" || o.StateDir != "/var/lib/holdfast" {
		t.Errorf("parsed %+v", o)
	}

	t.Setenv("HOLDFAST_HEARTBEAT", "often")
	if _, err := serve.Parse(nil, io.Discard); err == nil || !strings.Contains(err.Error(), `HOLDFAST_HEARTBEAT="often"`) {
		t.Errorf("bad variable: %v", err)
	}
	if _, err := serve.Parse([]string{"--heartbeat", "1s"}, io.Discard); err != nil {
		t.Errorf("a flag overrides a bad variable: %v", err)
	}
	os.Unsetenv("HOLDFAST_HEARTBEAT")

	// The rate limit service alone needs no --config.
	if o, err := serve.Parse([]string{"--config", "", "--grpc-listen", ":8081", "--rls-config", "/etc/ratelimit"}, io.Discard); err != nil || o.GRPCListen != ":8081" || o.RLSConfig != "/etc/ratelimit" {
		t.Errorf("--grpc-listen with --rls-config: %+v %v", o, err)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "memcached"}, `--backend "memcached"`},
		{[]string{"--config", ""}, "--config is required"},
		{[]string{"--expected-instances", "0"}, "--expected-instances 0"},
		{[]string{"--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"--call-timeout", "0s"}, "must be positive"},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--grpc-listen", ":8081"}, "--grpc-listen and --rls-config go together"},
		{[]string{"--rls-config", "rls.yaml"}, "--grpc-listen and --rls-config go together"},
		{[]string{"--config", "", "--rls-config", ""}, "--config is required (the policies' YAML file), or --rls-config with --grpc-listen"},
	} {
		if _, err := serve.Parse(tt.args, io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
}

func TestRedisURLNeverShown(t *testing.T) {
	if got := serve.Redact("redis://user:" + password + "@10.0.0.1:6379/0"); got != "redis://user:xxxxx@10.0.0.1:6379/0" {
		t.Errorf("Redact: %s", got)
	}
	if got := serve.Redact("redis://:" + password + "@h:1%zz"); strings.Contains(got, password) {
		t.Errorf("Redact of a bad URL: %s", got)
	}
	// A URL the client rejects: the error names the problem, not the password.
	for _, u := range []string{"redis://:" + password + "@127.0.0.1:6379/notadb", "redis://:" + password + "@127.0.0.1:6379/0?dial_timeout=soon", "redis://:" + password + "@h:1%zz"} {
		for _, backend := range []string{"goredis", "rueidis"} {
			o := options(t, u, testConfig)
			o.Backend = backend
			a, err := serve.New(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err == nil {
				a.Close()
				continue // rueidis accepts some of these
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("%s: error shows the password: %v", backend, err)
			}
		}
	}
}

func TestParseRedisCluster(t *testing.T) {
	o, err := serve.Parse([]string{"--config", "p.yaml"}, io.Discard)
	if err != nil || o.RedisCluster {
		t.Fatalf("default: %+v %v", o, err)
	}
	if o, err = serve.Parse([]string{"--config", "p.yaml", "--redis-cluster"}, io.Discard); err != nil || !o.RedisCluster {
		t.Errorf("--redis-cluster: %v %v", o.RedisCluster, err)
	}
	t.Setenv("HOLDFAST_REDIS_CLUSTER", "true")
	if o, err = serve.Parse([]string{"--config", "p.yaml"}, io.Discard); err != nil || !o.RedisCluster {
		t.Errorf("HOLDFAST_REDIS_CLUSTER=true: %v %v", o.RedisCluster, err)
	}
	if o, err = serve.Parse([]string{"--config", "p.yaml", "--redis-cluster=false"}, io.Discard); err != nil || o.RedisCluster {
		t.Errorf("the flag overrides the variable: %v %v", o.RedisCluster, err)
	}
	t.Setenv("HOLDFAST_REDIS_CLUSTER", "maybe")
	if _, err := serve.Parse([]string{"--config", "p.yaml"}, io.Discard); err == nil || !strings.Contains(err.Error(), `HOLDFAST_REDIS_CLUSTER="maybe"`) {
		t.Errorf("bad variable: %v", err)
	}
}

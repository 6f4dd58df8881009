package serve_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/internal/redistest"
)

// waitStatus polls /status until ok accepts it, failing after limit.
func waitStatus(t *testing.T, h http.Handler, limit time.Duration, what string, ok func(serve.Status) bool) serve.Status {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st := status(t, h)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, /status is not %s: %+v", limit, what, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkShards checks that st lists n shards, all closed, whose slot ranges
// cover the slot space once.
func checkShards(t *testing.T, st serve.Status, n int) {
	t.Helper()
	if len(st.Shards) != n {
		t.Fatalf("/status lists %d shards, want %d: %+v", len(st.Shards), n, st)
	}
	type rng struct{ lo, hi int }
	var rs []rng
	for _, sh := range st.Shards {
		if sh.Breaker != "closed" || sh.Instances < 1 {
			t.Errorf("shard %+v: want closed with at least one instance", sh)
		}
		for _, part := range strings.Split(sh.Slots, ",") {
			lo, hi, _ := strings.Cut(part, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				t.Fatalf("shard slots %q", sh.Slots)
			}
			rs = append(rs, rng{a, b})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	next := 0
	for _, r := range rs {
		if r.lo != next {
			t.Errorf("shard slots %v: gap or overlap at %d", rs, next)
		}
		next = r.hi + 1
	}
	if next != 16384 {
		t.Errorf("shard slots %v end at %d, want 16383", rs, next-1)
	}
}

// TestServeOnCluster runs serve on a 3-master Redis Cluster through both
// backends, given the seed list or one seed with --redis-cluster: requests
// are decided through Redis (RateLimit headers, 429 past the limit) and
// /status lists the three shards.
func TestServeOnCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	for _, backend := range []string{"goredis", "rueidis"} {
		for _, form := range []string{"seeds", "one-seed"} {
			t.Run(backend+"/"+form, func(t *testing.T) {
				o := options(t, c.URL(), testConfig)
				if form == "one-seed" {
					o.Redis, o.RedisCluster = "redis://"+c.Addrs()[1], true
				}
				o.Backend = backend
				a, _ := newApp(t, o)
				h := a.Handler()
				st := waitStatus(t, h, 10*time.Second, "3 shards", func(st serve.Status) bool { return len(st.Shards) == 3 })
				checkShards(t, st, 3)
				if st.Breaker != "closed" || st.Backend != backend {
					t.Errorf("/status %+v", st)
				}
				client := "cluster-" + backend + "-" + form
				for i, want := range []struct {
					code  int
					limit string
				}{
					{200, `"tb";r=2;t=10`}, {200, `"tb";r=1;t=20`}, {200, `"tb";r=0;t=30`}, {429, `"tb";r=0;t=10`},
				} {
					w := get(h, "/api/tb", client)
					var b struct{ Mode string }
					json.Unmarshal(w.Body.Bytes(), &b)
					if w.Code != want.code || w.Header().Get("RateLimit") != want.limit || b.Mode != "redis" ||
						w.Header().Get("RateLimit-Policy") != `"tb";q=3;w=30` {
						t.Errorf("tb request %d: %d RateLimit %q mode %q, want %d %q redis", i+1, w.Code, w.Header().Get("RateLimit"), b.Mode, want.code, want.limit)
					}
					if want.code == 429 && w.Header().Get("Retry-After") != "10" {
						t.Errorf("tb request %d: Retry-After %q, want 10", i+1, w.Header().Get("Retry-After"))
					}
				}
				for i, want := range []int{200, 200, 429} {
					if w := get(h, "/api/sw", client); w.Code != want {
						t.Errorf("sw request %d: %d, want %d", i+1, w.Code, want)
					}
				}
				// The raw JSON names the shards as operators see them.
				raw := get(h, "/status", "").Body.String()
				if n := strings.Count(raw, `"slots":`); n != 3 || !strings.Contains(raw, `"shards":[`) {
					t.Errorf("/status JSON: %s", raw)
				}
			})
		}
	}
}

// TestServeStartsDuringClusterOutage starts serve (rueidis, whose cluster
// client cannot be created while no seed answers) with every master of the
// cluster down: it becomes ready and limits locally; once the masters are
// back it connects, learns the three shards and decides through Redis.
func TestServeStartsDuringClusterOutage(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0, redistest.WithAOF())
	for _, n := range c.Nodes {
		n.Kill()
	}
	o := options(t, c.URL(), testConfig)
	o.Backend = "rueidis"
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
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", logs)
		}
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	get := func(path, client string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if client != "" {
			req.Header.Set("X-Client-ID", client)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, logs)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz", ""); code != 200 {
		t.Fatalf("/readyz during the outage: %d", code)
	}
	// One instance expected: its share is the whole bucket, decided by a lease.
	for i, want := range []int{200, 200, 200, 429} {
		code, body := get("/api/tb", "c1")
		if code != want || !strings.Contains(body, `"mode":"local"`) {
			t.Errorf("request %d during the outage: %d %s, want %d in mode local", i+1, code, body, want)
		}
	}
	var st serve.Status
	_, raw := get("/status", "")
	// Three grants logged: three entries, or fewer when they came within a
	// millisecond (one token bucket entry holds them all).
	if err := json.Unmarshal([]byte(raw), &st); err != nil || st.Breaker != "open" || st.PendingLog < 1 || st.PendingLog > 3 || !st.Ready {
		t.Errorf("/status during the outage: %s", raw)
	}
	for _, want := range []string{"Redis not reachable, limiting locally", "store unavailable: serve: not connected to Redis Cluster seeds"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}

	for _, n := range c.Nodes {
		n.Restart(t)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, raw = get("/status", "")
		st = serve.Status{}
		json.Unmarshal([]byte(raw), &st)
		if len(st.Shards) == 3 && st.Breaker == "closed" && st.PendingLog == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after the masters returned: %s\n%s", raw, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The outage's grants were replayed: the bucket is empty in Redis too.
	if code, body := get("/api/tb", "c1"); code != 429 || !strings.Contains(body, `"mode":"redis"`) {
		t.Errorf("after recovery: %d %s, want 429 decided through Redis", code, body)
	}
	if code, body := get("/api/tb", "c2"); code != 200 || !strings.Contains(body, `"mode":"redis"`) {
		t.Errorf("a fresh client after recovery: %d %s, want 200 through Redis", code, body)
	}
	if !strings.Contains(logs.String(), "holdfast serve: connected to Redis") {
		t.Errorf("logs lack the connection:\n%s", logs)
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
}

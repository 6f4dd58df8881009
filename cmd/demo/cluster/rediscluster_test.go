package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/internal/demotest"
	"github.com/holdfast/holdfast/core/driver"
)

// TestClusterSummary: the lines a --redis-cluster run adds name the killed
// master and each key's shard and decisions by mode; the report shows them
// and the table's legend says what DOWN means there.
func TestClusterSummary(t *testing.T) {
	r := fakeRecord()
	if r.ClusterSummary() != nil {
		t.Error("a run on one redis-server has cluster lines")
	}
	r.Cluster = &ClusterRun{
		Masters: []Master{
			{Addr: "127.0.0.1:7001", Slots: []driver.SlotRange{{Start: 0, End: 5460}}},
			{Addr: "127.0.0.1:7002", Slots: []driver.SlotRange{{Start: 5461, End: 10922}}},
			{Addr: "127.0.0.1:7003", Slots: []driver.SlotRange{{Start: 10923, End: 16383}}},
		},
		Killed: 1, Keys: map[string]string{}, Slots: map[string]int{},
		Breakers: map[string]map[string]int{"0-5460": {"closed": 40}, "5461-10922": {"open": 38, "closed": 2}},
	}
	for _, s := range r.Series {
		k := driver.StorageKey(demoPrefix, s.Route, s.Client)
		r.Cluster.Keys[s.Name()], r.Cluster.Slots[s.Name()] = k, driver.HashSlot(k)
	}
	r.Series[0].OutageModes = map[string]int{"local": 150, "redis": 2}
	r.Series[2].OutageModes = map[string]int{"redis": 152}
	got := strings.Join(r.ClusterSummary(), "\n")
	for _, want := range []string{
		"redis cluster: 3 masters, no replicas: 127.0.0.1:7001 slots 0-5460, 127.0.0.1:7002 slots 5461-10922, 127.0.0.1:7003 slots 10923-16383",
		"killed master 127.0.0.1:7002 (slots 5461-10922), serving tb heavy's key hf:{tb:heavy} (slot 6762): SIGKILL at 4.0s, restarted at 8.0s",
		"  tb heavy   slot  6762  killed shard 5461-10922: local 150, redis 2",
		"  sw heavy   slot  5038  healthy shard 0-5460: redis 152",
		"  tb gentle  slot 16191  healthy shard 10923-16383: no decisions",
		"0-5460 closed 40; 5461-10922 (killed) open 38, closed 2; 10923-16383 not seen",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	dir := t.TempDir()
	if err := WriteReport(dir, r, Checks(r)); err != nil {
		t.Fatal(err)
	}
	page, _ := os.ReadFile(filepath.Join(dir, HTMLFile))
	for _, want := range []string{"<h2>Redis Cluster</h2>", "killed master 127.0.0.1:7002", "redis DOWN: the killed master is down",
		"tb heavy&#39;s master down (SIGKILL)"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
}

// TestRedisClusterEndToEnd runs `cluster --redis-cluster` with short
// phases: a 3-master Redis Cluster, four serve instances (the demo binary,
// built here) and nginx; the master of tb heavy's key is killed after 3s
// and restarted 3s later. The invariants hold, the summary names the killed
// master, tb heavy's decisions went local while the healthy shards' keys
// stayed on Redis, and every process is stopped.
func TestRedisClusterEndToEnd(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "holdfast-demo")
	built := time.Now()
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("go build: %v", time.Since(built).Round(time.Millisecond))
	report := filepath.Join(dir, "report")
	// A generous call deadline: on a busy machine (two cores, other tests
	// running) a slow call to a healthy master would open its shard's
	// breaker, and each such spurious outage costs the heavy client up to
	// a bucket (the replay is conservative). The real outage is a SIGKILL:
	// its calls fail at once, whatever the deadline.
	out, progress := runShort(t, bin, "--redis-cluster", "--normal", "3s", "--outage", "3s", "--after", "4s", "--call-timeout", "250ms", "--out", report)
	t.Logf("cluster output:\n%s", out)

	demotest.CheckShortRun(t, out)
	for _, want := range []string{"ok   no errors: errors 0, of which 5xx 0",
		"ok   instances recovered: app1 closed pending_log 0", "redis cluster: 3 masters, no replicas: ", "invariants held"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	killed := regexp.MustCompile(`(?m)^killed master (127\.0\.0\.1:\d+) \(slots ([\d,-]+)\), serving tb heavy's key hf:\{tb:heavy\} \(slot 6762\): SIGKILL at ([\d.]+)s, restarted at ([\d.]+)s$`).FindStringSubmatch(out)
	if killed == nil {
		t.Fatalf("no killed-master line")
	}
	if !strings.Contains(progress, "on "+killed[1]+", slots "+killed[2]) {
		t.Errorf("the killed master %s (slots %s) is not one the run started:\n%s", killed[1], killed[2], progress)
	}
	// Per key, the decisions while the master was down.
	modes := map[string]map[string]int{}
	where := map[string]string{}
	line := regexp.MustCompile(`(?m)^  (\w+ \w+)\s+slot\s+\d+  (killed|healthy) shard [\d,-]+: (.*)$`)
	for _, m := range line.FindAllStringSubmatch(out, -1) {
		where[m[1]], modes[m[1]] = m[2], map[string]int{}
		for _, kv := range strings.Split(m[3], ", ") {
			k, v, _ := strings.Cut(kv, " ")
			modes[m[1]][k], _ = strconv.Atoi(v)
		}
	}
	if len(where) != 2*len(demoRoutes()) || where["tb heavy"] != "killed" || where["sw heavy"] != "healthy" {
		t.Fatalf("shards of the keys %v, want tb heavy on the killed one, sw heavy on a healthy one", where)
	}
	total := func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	}
	// Over the ~3s outage at 50 req/s: about 150 decisions each. A call that
	// fails on a loaded machine is decided locally, so allow a few.
	if tb := modes["tb heavy"]; total(tb) < 100 || tb["local"] < total(tb)*9/10 {
		t.Errorf("tb heavy (killed shard) while down: %v, want nearly all local", tb)
	}
	if sw := modes["sw heavy"]; total(sw) < 100 || sw["redis"] < total(sw)*9/10 {
		t.Errorf("sw heavy (healthy shard) while down: %v, want nearly all through Redis", sw)
	}
	if !regexp.MustCompile(`(?m)^shard breakers in /status while it was down .*` + regexp.QuoteMeta(killed[2]) + ` \(killed\) open \d+`).MatchString(out) {
		t.Errorf("no open breaker seen for the killed shard")
	}
	page, _ := os.ReadFile(filepath.Join(report, HTMLFile))
	if !strings.Contains(string(page), "<h2>Redis Cluster</h2>") {
		t.Error("report.html lacks the Redis Cluster section")
	}
	// Every process it started is gone.
	pids := regexp.MustCompile(`pid (\d+)`).FindAllStringSubmatch(progress, -1)
	if len(pids) < 3+1+1+1 { // three nodes, nginx, the kill and the restart
		t.Errorf("stderr names %d pids:\n%s", len(pids), progress)
	}
	for _, p := range pids {
		if st, err := os.ReadFile("/proc/" + p[1] + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
			t.Errorf("process %s still runs", p[1])
		}
	}
}

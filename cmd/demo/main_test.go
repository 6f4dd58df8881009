package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/internal/demotest"
)

// TestClusterEndToEnd builds the binary and runs `cluster` with short
// phases: redis-server, four serve instances and nginx on loopback ports,
// Redis killed after 3s and restarted after 3s more. It must exit 0 and
// print, per route, the heavy client within its bound and the gentle
// client never rejected.
func TestClusterEndToEnd(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "holdfast-demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	report := filepath.Join(dir, "report")
	cmd := exec.CommandContext(ctx, bin, "cluster", "--normal", "3s", "--outage", "3s", "--after", "4s", "--out", report)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := stdout.String()
	if err != nil {
		t.Fatalf("cluster: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	t.Logf("cluster output:\n%s", out)

	demotest.CheckShortRun(t, out)
	for _, want := range []string{"ok   no errors: errors 0, of which 5xx 0", "ok   instances recovered: app1 closed pending_log 0",
		"invariants held", "report: " + filepath.Join(report, "report.html")} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The table has a row per second, with Redis down for the middle three.
	rows := regexp.MustCompile(`(?m)^\s+(\d+)  (up|DOWN)\s`).FindAllStringSubmatch(out, -1)
	down := 0
	for _, r := range rows {
		if r[2] == "DOWN" {
			down++
		}
	}
	if len(rows) != 10 || down < 3 || down > 4 {
		t.Errorf("table: %d rows, %d with Redis down; want 10 and 3-4", len(rows), down)
	}
	for _, f := range []string{"report.svg", "report.html", "table.md", "table.txt"} {
		if fi, err := os.Stat(filepath.Join(report, f)); err != nil || fi.Size() == 0 {
			t.Errorf("report file %s: %v", f, err)
		}
	}
	// Every process it started is gone: nothing listens on the ports it
	// printed.
	for _, p := range regexp.MustCompile(`pid (\d+)`).FindAllStringSubmatch(stderr.String(), -1) {
		pid, _ := strconv.Atoi(p[1])
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); !strings.Contains(string(st), ") Z ") {
				t.Errorf("process %d still runs", pid)
			}
		}
	}
}

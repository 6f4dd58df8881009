package doccheck_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/redistest"
)

// TestReadmeQuickStart builds the README's quick start, as a module of its
// own with the checkout as holdfast, and runs it against a real
// redis-server: the README cannot drift from the API. Its policy admits a
// burst of 20, so 25 requests in a row get 20 (or 21, if a token refills
// meanwhile) answers 200 and the rest 429; SIGTERM stops it cleanly.
func TestReadmeQuickStart(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, ok := quickStart(string(readme))
	if !ok {
		t.Fatal("README.md has no ```go block under \"## Quick start\"")
	}
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", src)
	write("go.mod", "module quickstart\n\ngo 1.26\n\nrequire github.com/holdfast/holdfast v0.0.0\n\nreplace github.com/holdfast/holdfast => "+root+"\n")
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	bin := filepath.Join(dir, "quickstart")
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", bin, "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	srv := redistest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "REDIS_URL="+srv.URL(), "ADDR="+addr)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-done
		}
	}()
	get := func(path string) (int, string, error) {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Header.Set("X-Client-ID", "client-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, err := get("/metrics"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quick start did not listen on %s:\n%s", addr, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	codes := map[int]int{}
	for i := range 25 {
		code, body, err := get("/api/hello")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		codes[code]++
		if code == 200 && !strings.Contains(body, `"mode":"redis"`) {
			t.Fatalf("request %d: %s, want a decision through Redis", i, body)
		}
	}
	if ok := codes[200]; ok < 20 || ok > 21 || codes[200]+codes[429] != 25 {
		t.Fatalf("25 requests: %v, want 20 (or 21) answered 200 and the rest 429", codes)
	}
	_, metrics, err := get("/metrics")
	if err != nil || !strings.Contains(metrics, fmt.Sprintf(`holdfast_decisions_total{mode="redis",policy="api",result="allowed"} %d`, codes[200])) {
		t.Fatalf("/metrics lacks the allowed decisions (%v):\n%.2000s", err, metrics)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the quick start did not stop within 10 s of SIGTERM")
	}
}

// quickStart returns the first ```go block after "## Quick start".
func quickStart(readme string) (string, bool) {
	i := strings.Index(readme, "## Quick start")
	if i < 0 {
		return "", false
	}
	rest := readme[i:]
	a := strings.Index(rest, "```go\n")
	if a < 0 {
		return "", false
	}
	rest = rest[a+len("```go\n"):]
	b := strings.Index(rest, "\n```")
	if b < 0 {
		return "", false
	}
	return rest[:b+1], true
}

package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/redistest"
)

// TestServeRestartMidOutage runs four `serve` processes, each with a state
// dir of its own and no --id, as a user would: a heavy client at 50 req/s
// round-robin on a token bucket of 20 + 5/s, Redis killed, one instance
// stopped (SIGTERM, then SIGKILL) and started again during the outage,
// Redis back. The instances together admit within [0.9, 1.05] of the bound
// and never answer 5xx: the restarted one gets its ID, instance count and
// leases back from its state dir.
func TestServeRestartMidOutage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "holdfast-demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) { serveRestart(t, bin, sig, false) })
	}
	// The other moment: Redis has just come back, and the instance is
	// replaying its outage log or waiting at the recovery barrier when it
	// dies; it comes back with its log from the state dir and replays it
	// again, its batches counted once.
	t.Run("SIGKILL_in_recovery", func(t *testing.T) { serveRestart(t, bin, syscall.SIGKILL, true) })
}

// breakerOf returns the breaker state /status reports on port, or "".
func breakerOf(port int) string {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", port))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st struct {
		Breaker string `json:"breaker"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return ""
	}
	return st.Breaker
}

// serveRestart runs the test with instance 1 stopped by sig in the outage,
// or, with inRecovery, once Redis is back and it is seen reconciling.
func serveRestart(t *testing.T, bin string, sig syscall.Signal, inRecovery bool) {
	dir := t.TempDir()
	srv := redistest.Start(t, redistest.WithAOF())
	cfg := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(cfg, []byte("prefix: \"hf:\"\npolicies:\n  - name: tb\n    path: /api/tb\n    algorithm: token_bucket\n    capacity: 20\n    refill_per_second: 5\n    key: header:X-Client-ID\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := make([]int, 4)
	procs := make([]*exec.Cmd, 4)
	start := func(i int) {
		c := exec.Command(bin, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--redis", srv.URL(),
			"--config", cfg, "--state-dir", filepath.Join(dir, fmt.Sprint("state", i)),
			"--heartbeat", "500ms", "--probe-interval", "500ms", "--call-timeout", "300ms")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = c
	}
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
		start(i)
	}
	defer func() {
		for _, p := range procs {
			p.Process.Signal(syscall.SIGCONT) // one left stopped would never take the SIGTERM
			p.Process.Signal(syscall.SIGTERM)
			p.Wait()
		}
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(i int) (int, error) {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/api/tb", ports[i]), nil)
		req.Header.Set("X-Client-ID", "heavy")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	ready := func(i int) bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[i]))
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := range ports {
		for !ready(i) {
			if time.Now().After(deadline) {
				t.Fatalf("instance %d never ready", i)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(1500 * time.Millisecond) // every instance has heartbeated: N = 4

	var admitted, denied, refused, failed atomic.Int64
	var paused atomic.Int64 // the instance the client leaves out while it is stopped, or -1
	paused.Store(-1)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if int64(n%4) == paused.Load() {
				continue
			}
			switch code, err := get(n % 4); {
			case err != nil:
				refused.Add(1) // the restarting instance: a load balancer sends it elsewhere
			case code == 200:
				admitted.Add(1)
			case code == 429:
				denied.Add(1)
			default:
				failed.Add(1)
			}
		}
	}()
	began := time.Now()
	time.Sleep(4 * time.Second)
	srv.Kill()
	restart := func() {
		procs[1].Process.Signal(sig)
		procs[1].Wait()
		start(1)
	}
	if inRecovery {
		time.Sleep(5 * time.Second)
		// Instance 3 is stopped (SIGSTOP) while Redis comes back, so the
		// recovery barrier does not come forward when the others arrive:
		// instance 1 stays at it for its whole time (two probe intervals
		// and two call deadlines), long enough to be seen reconciling.
		// With every instance up, the barrier opens as the last one
		// arrives, and an instance that arrives last is reconciling only
		// for as long as its replay takes, a few milliseconds.
		paused.Store(3)
		time.Sleep(100 * time.Millisecond) // a request to 3 under way has its answer
		if err := procs[3].Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		srv.Restart(t)
		// Killed as soon as it is seen reconciling (replaying or at the
		// barrier).
		state := ""
		for end := time.Now().Add(5 * time.Second); state != "reconciling" && time.Now().Before(end); {
			state = breakerOf(ports[1])
			time.Sleep(5 * time.Millisecond)
		}
		if state != "reconciling" {
			procs[3].Process.Signal(syscall.SIGCONT)
			t.Fatalf("instance 1 never seen reconciling after Redis came back (last %q)", state)
		}
		restart()
		if err := procs[3].Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		paused.Store(-1)
	} else {
		time.Sleep(2 * time.Second)
		restart()
		time.Sleep(3 * time.Second)
		srv.Restart(t)
	}
	time.Sleep(6 * time.Second)
	close(stop)
	<-done
	took := time.Since(began)
	bound := 20 + 5*took.Seconds()
	ratio := float64(admitted.Load()) / bound
	t.Logf("%v: admitted %d denied %d refused %d 5xx %d over %v: bound %.1f, ratio %.3f", sig, admitted.Load(), denied.Load(), refused.Load(), failed.Load(), took.Round(time.Millisecond), bound, ratio)
	if failed.Load() != 0 {
		t.Errorf("%d answers were 5xx", failed.Load())
	}
	if ratio < 0.9 || ratio > 1.05 {
		t.Errorf("admitted/bound = %.3f, want within [0.9, 1.05]", ratio)
	}
}

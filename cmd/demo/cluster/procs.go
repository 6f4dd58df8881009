package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/redisprobe"
)

// A proc is one child process the cluster started. Every child runs in a
// process group of its own, so a Ctrl-C in the terminal reaches only the
// cluster, which then stops its children in order, by PID; and it gets
// SIGKILL (SIGTERM for nginx, whose master must stop its workers) if the
// cluster dies first.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProc starts bin with args, its output appended to logPath.
func startProc(name, logPath string, deathSig syscall.Signal, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid returns the process's id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process and waits up to grace for it to exit, then
// sends SIGKILL and waits. Stopping an exited process does nothing.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// findBinary looks for name on PATH and then in the sbin directories that a
// normal user's PATH often lacks (Debian installs nginx in /usr/sbin).
func findBinary(name, debianPackage string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in /usr/sbin: install the Debian package %s (apt-get install %s, or `make deps` as root)",
		name, debianPackage, debianPackage)
}

// redisServer is the cluster's redis-server, or one node of its Redis
// Cluster: killed and restarted on the same port and directory, with the
// append-only file fsynced on every write so a restart finds every write
// acknowledged before the kill.
type redisServer struct {
	bin, dir string
	port     int
	cluster  bool // a Redis Cluster node (clusterNodeArgs)
	p        *proc
	frozen   bool // SIGSTOPped by --fault stop, not yet resumed
}

func (r *redisServer) start(ctx context.Context) error {
	args := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no"}
	if r.cluster {
		args = append(args, clusterNodeArgs...)
	}
	p, err := startProc("redis-server", filepath.Join(r.dir, "redis.log"), syscall.SIGKILL, r.bin, args...)
	if err != nil {
		return err
	}
	r.p = p
	if err := waitFor(ctx, p, 5*time.Second, func() bool { return redisprobe.Probe(r.addr(), nil, "", p.cmd.Process.Pid) == redisprobe.Ready }); err != nil {
		p.stop(syscall.SIGKILL, 0)
		return fmt.Errorf("redis-server on %s: %w (see %s)", r.addr(), err, filepath.Join(r.dir, "redis.log"))
	}
	return nil
}

func (r *redisServer) addr() string { return loopback(r.port) }

// kill crashes the server: SIGKILL by PID, no shutdown save.
func (r *redisServer) kill() { r.p.stop(syscall.SIGKILL, 0) }

// httpOK reports whether GET url answers 200.
func httpOK(c *http.Client, url string) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitFor polls ready every 50ms until it is true, p exits, ctx ends or
// limit passes.
func waitFor(ctx context.Context, p *proc, limit time.Duration, ready func() bool) error {
	deadline := time.Now().Add(limit)
	for {
		if ready() {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("exited: %v", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errInterrupted is returned when the run was cut short by a signal.
var errInterrupted = errors.New("interrupted")

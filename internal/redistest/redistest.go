// Package redistest starts real redis-server processes for tests: each on a
// free loopback port with its own temporary directory, stopped by PID when
// the test ends. Servers are independent, so tests using them may run in
// parallel.
package redistest

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/redisprobe"
)

// Bounds on waiting for a server.
const (
	// ReadyTimeout bounds the wait for a new server to answer PING.
	ReadyTimeout = 5 * time.Second
	// StopTimeout bounds the wait after SIGTERM before SIGKILL is sent.
	StopTimeout = 3 * time.Second
	// startAttempts is how many free ports Start tries before giving up.
	startAttempts = 5
)

// An Option configures Start.
type Option func(*config)

type config struct {
	aof      bool
	password string
	tls      *TLSFiles
	args     []string
}

// WithAOF turns on the append-only file with fsync on every write, so the
// data set survives Kill and Restart.
func WithAOF() Option {
	return func(c *config) { c.aof = true }
}

// WithPassword makes the server require password pw (requirepass). URL and
// Do carry it.
func WithPassword(pw string) Option {
	return func(c *config) { c.password = pw }
}

// WithArgs appends redis-server command-line configuration, such as
// "--maxmemory", "1mb". Later arguments override the defaults.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// A Server is a redis-server process owned by one test. Its methods are safe
// for concurrent use.
type Server struct {
	bin  string
	dir  string
	conf config

	mu     sync.Mutex
	port   int
	proc   *process
	paused bool
	// ctlPass, when set, is the password the server requires now, which
	// Do uses; URL keeps conf.password (RotatePassword).
	ctlPass string
}

// process is one run of redis-server; done is closed when it has exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts a redis-server on a free 127.0.0.1 port, with its own
// t.TempDir() as its working directory and no RDB snapshots. It returns once
// the server answers PING, and stops the server when the test ends. A missing
// redis-server binary fails the test: integration tests must not be skipped.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found on PATH (%v): run `make deps` or `apt-get install redis-server`", err)
	}
	s := &Server{bin: bin, dir: t.TempDir()}
	for _, o := range opts {
		o(&s.conf)
	}
	t.Cleanup(func() { s.shutdown(t) })
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: find a free port: %v", err)
		}
		s.mu.Lock()
		s.port = port
		lastErr = s.startLocked()
		s.mu.Unlock()
		if lastErr == nil {
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
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

// Addr is the server's "127.0.0.1:port".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL is the server's "redis://127.0.0.1:port/0", with ":password@" before
// the address when the server has one.
func (s *Server) URL() string {
	u := url.URL{Scheme: "redis", Host: s.Addr(), Path: "/0"}
	if s.conf.tls != nil {
		u.Scheme = "rediss"
	}
	if s.conf.password != "" {
		u.User = url.UserPassword("", s.conf.password)
	}
	return u.String()
}

// Dir is the server's working directory (AOF and log live there).
func (s *Server) Dir() string { return s.dir }

// startLocked starts a process on s.port and waits until it answers PING.
func (s *Server) startLocked() error {
	p, err := s.spawnLocked()
	if err != nil {
		return err
	}
	if err := waitReady(s.port, p, s.clientTLS(), s.conf.password); err != nil {
		p.kill()
		s.proc = nil
		return fmt.Errorf("port %d: %w\n%s", s.port, err, s.logTail())
	}
	return nil
}

// spawnLocked starts a process on s.port, with extra appended to its
// configuration for this run only, and returns without waiting for it.
func (s *Server) spawnLocked(extra ...string) (*process, error) {
	appendonly := "no"
	if s.conf.aof {
		appendonly = "yes"
	}
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--logfile", s.logPath(), "--daemonize", "no",
		"--save", "", "--appendonly", appendonly, "--appendfsync", "always",
	}
	if s.conf.password != "" {
		args = append(args, "--requirepass", s.conf.password)
	}
	if f := s.conf.tls; f != nil {
		args[1] = "0"
		args = append(args, "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", f.Cert,
			"--tls-key-file", f.Key, "--tls-ca-cert-file", f.CA, "--tls-auth-clients", "no")
	}
	args = append(append(args, s.conf.args...), extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	s.proc, s.paused = p, false
	return p, nil
}

// waitReady polls PING until the server answers PONG (or NOAUTH, when it
// has a password), exits, or ReadyTimeout passes. A server still loading its
// AOF answers LOADING and is not ready. The server that answers must be p:
// between freePort and p's bind another test's server may take the port, and
// p then exits on "Address already in use" while that server answers PING.
// So readiness asks INFO for the server's process_id; where the server
// answers NOAUTH (a password this package was not given), p must still be
// running a moment after the answer.
func waitReady(port int, p *process, tc *tls.Config, password string) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(ReadyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited: %v", p.err)
		default:
		}
		switch redisprobe.Probe(addr, tc, password, p.cmd.Process.Pid) {
		case redisprobe.Ready:
			return nil
		case redisprobe.Foreign:
			return fmt.Errorf("another server answers on port %d", port)
		case redisprobe.Unverified:
			select {
			case <-p.done:
				return fmt.Errorf("redis-server exited: %v", p.err)
			case <-time.After(100 * time.Millisecond):
				return nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("no PONG within %v", ReadyTimeout)
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM, then SIGKILL if the process outlives StopTimeout.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(StopTimeout):
		p.kill()
	}
}

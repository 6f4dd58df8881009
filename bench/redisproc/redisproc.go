// Package redisproc starts redis-server processes for the benchmark harness:
// each on a free 127.0.0.1 port with its own temporary directory, no
// persistence, and stopped by PID. It is the bench module's twin of the main
// module's internal/redistest (a testing.TB helper), and shares its
// readiness probe, internal/redisprobe.
package redisproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/redisprobe"
)

// Bounds on waiting for a server.
const (
	// ReadyTimeout bounds the wait for a new server to answer PING.
	ReadyTimeout = 5 * time.Second
	// StopTimeout bounds the wait after SIGTERM before SIGKILL is sent.
	StopTimeout = 3 * time.Second
	// startAttempts is how many free ports Start tries.
	startAttempts = 5
)

// A Server is one redis-server owned by this process. Its methods are safe
// for concurrent use.
type Server struct {
	bin  string
	dir  string
	args []string

	mu     sync.Mutex
	port   int
	proc   *process
	paused bool
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

var (
	liveMu sync.Mutex
	live   = map[*Server]struct{}{}
)

// Start starts a redis-server on a free loopback port in a new temporary
// directory. args are extra redis-server options ("--maxmemory", "1gb").
// It returns once the server answers PING.
func Start(args ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redisproc: redis-server not found (run `make deps`): %w", err)
	}
	dir, err := os.MkdirTemp("", "holdfast-bench-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, args: args}
	var lastErr error
	for range startAttempts {
		port, err := FreePort()
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		s.mu.Lock()
		s.port = port
		lastErr = s.startLocked()
		s.mu.Unlock()
		if lastErr == nil {
			liveMu.Lock()
			live[s] = struct{}{}
			liveMu.Unlock()
			return s, nil
		}
	}
	return nil, errors.Join(fmt.Errorf("redisproc: start redis-server: %w", lastErr), os.RemoveAll(dir))
}

// StopAll stops every server Start returned that is still running, for a
// signal handler.
func StopAll() {
	liveMu.Lock()
	ss := make([]*Server, 0, len(live))
	for s := range live {
		ss = append(ss, s)
	}
	liveMu.Unlock()
	for _, s := range ss {
		s.Stop()
	}
}

// FreePort returns a loopback port that was free a moment ago (cmd/scriptcost
// starts its servers under valgrind with it).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port is the server's TCP port.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// URL is "redis://127.0.0.1:port/0".
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// PID is the running process's id, or 0.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func (s *Server) startLocked() error {
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no", "--save", "", "--appendonly", "no",
	}
	cmd := exec.Command(s.bin, append(args, s.args...)...)
	cmd.Dir = s.dir
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	s.proc, s.paused = p, false
	if err := waitReady(s.port, p); err != nil {
		p.kill()
		s.proc = nil
		return fmt.Errorf("port %d: %w", s.port, err)
	}
	return nil
}

// waitReady polls until p answers PING, exits, or ReadyTimeout passes. The
// server that answers must be p (INFO's process_id, redisprobe): between
// FreePort and p's bind another server may take the port, and p then exits
// on "Address already in use" while that server answers PING.
func waitReady(port int, p *process) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(ReadyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited: %v", p.err)
		default:
		}
		switch redisprobe.Probe(addr, nil, "", p.cmd.Process.Pid) {
		case redisprobe.Ready:
			return nil
		case redisprobe.Foreign, redisprobe.Unverified:
			return fmt.Errorf("another server answers on port %d", port)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("no PONG within %v", ReadyTimeout)
}

func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Kill sends SIGKILL and waits for the process to exit. The data set is
// lost (no persistence).
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Restart starts a new process on the same port after Kill.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("redisproc: restart of a running server")
	}
	var err error
	for deadline := time.Now().Add(ReadyTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		// The port can stay busy for a moment after the kill.
		if err = s.startLocked(); err == nil {
			return nil
		}
	}
	return err
}

// Pause sends SIGSTOP: the server keeps its sockets but answers nothing.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT after Pause.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("redisproc: server not running")
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		return err
	}
	s.paused = paused
	return nil
}

// Stop ends the process (SIGCONT if paused, SIGTERM, SIGKILL after
// StopTimeout) and removes its directory. It is safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.proc; p != nil {
		if s.paused {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(StopTimeout):
			p.kill()
		}
		s.proc = nil
	}
	_ = os.RemoveAll(s.dir)
	liveMu.Lock()
	delete(live, s)
	liveMu.Unlock()
}

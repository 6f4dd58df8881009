package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Kill sends SIGKILL to the server and waits for it to exit: a crash, with
// no chance to write anything more. It does nothing if the server is not
// running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc, s.paused = nil, false
	}
}

// Stop sends SIGTERM to the server (resuming it first if paused) and waits
// for it to exit, sending SIGKILL after StopTimeout. It does nothing if the
// server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.proc == nil {
		return
	}
	if s.paused {
		_ = s.proc.cmd.Process.Signal(syscall.SIGCONT)
	}
	s.proc.stop()
	s.proc, s.paused = nil, false
}

// Restart starts the server again on the same port and directory, stopping
// it first if it is still running. With WithAOF the data set comes back;
// without it the server starts empty.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
	if err := s.startLocked(); err != nil {
		t.Fatalf("redistest: restart redis-server: %v", err)
	}
}

// Pause sends SIGSTOP: the server keeps its port open and accepts
// connections in the kernel, but answers nothing, like a black-holed host.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT to a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.cmd.Process.Signal(sig)
		s.paused = paused
	}
}

// shutdown is the test cleanup: stop the server, and show its log if the
// test failed.
func (s *Server) shutdown(t testing.TB) {
	s.Stop()
	if t.Failed() {
		t.Logf("redistest: redis-server log (%s):\n%s", s.Addr(), s.logTail())
	}
}

// Do runs one command on the server over a short-lived connection and
// returns its reply formatted with fmt.Sprint ("" for a nil reply). Any other
// error fails the test.
func (s *Server) Do(t testing.TB, args ...string) string {
	t.Helper()
	c := s.client(s.password(), 0)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	v, err := c.Do(ctx, argv...).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatalf("redistest: %v: %v", args, err)
	}
	return fmt.Sprint(v)
}

// client returns a client of its own (one connection, no retries) that
// authenticates with pw; timeout bounds its dial, reads and writes (0:
// go-redis's defaults).
func (s *Server) client(pw string, timeout time.Duration) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), Password: pw, MaxRetries: -1, DisableIdentity: true, TLSConfig: s.clientTLS(),
		PoolSize: 1, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout})
}

// password is the password the server requires now.
func (s *Server) password() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.passwordLocked()
}

// passwordLocked is password for a caller holding mu.
func (s *Server) passwordLocked() string {
	if s.ctlPass != "" {
		return s.ctlPass
	}
	return s.conf.password
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// logTail returns the last few KiB of the server's log.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

package redisproc

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/redisprobe"
)

// ping reports whether the server s started answers PING as itself.
func ping(s *Server) bool {
	return redisprobe.Probe(s.Addr(), nil, "", s.PID()) == redisprobe.Ready
}

func TestLifecycle(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if !ping(s) || s.PID() == 0 {
		t.Fatalf("server at %s (pid %d) does not answer", s.Addr(), s.PID())
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if ping(s) {
		t.Fatal("a stopped server answered PING")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if !ping(s) {
		t.Fatal("no answer after SIGCONT")
	}
	port := s.Port()
	s.Kill()
	if c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("port still open after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Port() != port || !ping(s) {
		t.Fatalf("restarted on port %d, want %d", s.Port(), port)
	}
	dir := s.dir
	s.Stop()
	s.Stop() // twice is fine
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s left behind: %v", dir, err)
	}
}

// TestReadyIsThisServer: a server whose port another server holds exits
// on "Address already in use" while the other answers PING; its start
// must fail (Start then tries another port), not pass as ready.
func TestReadyIsThisServer(t *testing.T) {
	other, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop()
	s := &Server{bin: other.bin, dir: t.TempDir(), port: other.Port()}
	s.mu.Lock()
	err = s.startLocked()
	s.mu.Unlock()
	if err == nil {
		s.Stop()
		t.Fatalf("a server on the port of another (%s) started", other.Addr())
	}
	if !strings.Contains(err.Error(), "another server answers") && !strings.Contains(err.Error(), "exited") {
		t.Fatalf("start error %v, want another server answering or an exit", err)
	}
	if !ping(other) {
		t.Fatal("the other server stopped answering")
	}
}

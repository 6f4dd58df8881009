package redisproc

import (
	"net"
	"os"
	"testing"
	"time"
)

func TestLifecycle(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if !ping(s.Addr()) || s.PID() == 0 {
		t.Fatalf("server at %s (pid %d) does not answer", s.Addr(), s.PID())
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if ping(s.Addr()) {
		t.Fatal("a stopped server answered PING")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if !ping(s.Addr()) {
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
	if s.Port() != port || !ping(s.Addr()) {
		t.Fatalf("restarted on port %d, want %d", s.Port(), port)
	}
	dir := s.dir
	s.Stop()
	s.Stop() // twice is fine
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s left behind: %v", dir, err)
	}
}

package goredis

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestCheckedConnSkipsRecentCheck: go-redis's health check (a RawConn.Read
// of its socket) runs on a connection idle for idleCheck or more, and not
// on one read or written less than idleCheck ago; a TLS-like connection
// without a socket is not wrapped.
func TestCheckedConnSkipsRecentCheck(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := checkedDialer((&net.Dialer{}).DialContext)(context.Background(), "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer := <-accepted
	defer peer.Close()
	cc, ok := c.(*checkedConn)
	if !ok {
		t.Fatalf("dialed %T, want *checkedConn", c)
	}
	checks := func() int {
		raw, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if err := raw.Read(func(uintptr) bool { n++; return true }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if n := checks(); n != 0 {
		t.Fatalf("check ran %d times right after a write, want 0", n)
	}
	// Idle past idleCheck (set back the last use rather than sleep).
	cc.last.Store(sinceEpoch() - int64(2*idleCheck))
	if n := checks(); n != 1 {
		t.Fatalf("check ran %d times on an idle connection, want 1", n)
	}
	buf := make([]byte, 6)
	go func() { _, _ = peer.Write([]byte("+PONG\r\n")) }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	if n := checks(); n != 0 {
		t.Fatalf("check ran %d times right after a read, want 0", n)
	}

	plain, other := net.Pipe() // no socket: as a TLS connection
	defer plain.Close()
	defer other.Close()
	got, err := checkedDialer(func(context.Context, string, string) (net.Conn, error) { return plain, nil })(context.Background(), "tcp", "x")
	if err != nil || got != plain {
		t.Fatalf("a connection without a socket came back as %T (%v), want it unwrapped", got, err)
	}
}

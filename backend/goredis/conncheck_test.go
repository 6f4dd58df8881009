package goredis

import (
	"context"
	"io"
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
	// recent runs use (a write or a read), then the check, and wants the
	// check skipped: when less than idleCheck passed from the end of the
	// use to the end of the check (a loaded machine can stall the test for
	// longer; then it tries again).
	recent := func(what string, use func()) {
		t.Helper()
		for range 100 {
			use()
			used := cc.last.Load()
			n := checks()
			if sinceEpoch()-used >= int64(idleCheck) {
				continue
			}
			if n != 0 {
				t.Fatalf("check ran %d times right after a %s, want 0", n, what)
			}
			return
		}
		t.Fatalf("no check within %v of a %s in 100 tries", idleCheck, what)
	}
	recent("write", func() {
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
	})
	// Idle past idleCheck (set back the last use rather than sleep).
	cc.last.Store(sinceEpoch() - int64(2*idleCheck))
	if n := checks(); n != 1 {
		t.Fatalf("check ran %d times on an idle connection, want 1", n)
	}
	recent("read", func() {
		cc.last.Store(sinceEpoch() - int64(2*idleCheck)) // idle again: only the read makes it recent
		buf := make([]byte, 7)
		if _, err := peer.Write([]byte("+PONG\r\n")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	})

	plain, other := net.Pipe() // no socket: as a TLS connection
	defer plain.Close()
	defer other.Close()
	got, err := checkedDialer(func(context.Context, string, string) (net.Conn, error) { return plain, nil })(context.Background(), "tcp", "x")
	if err != nil || got != plain {
		t.Fatalf("a connection without a socket came back as %T (%v), want it unwrapped", got, err)
	}
}

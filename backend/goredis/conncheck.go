package goredis

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// idleCheck is how long a connection must have been idle before go-redis's
// check that the server has not closed it runs (see checkedConn), as for
// the rueidis backend's lone-call connections.
const idleCheck = time.Millisecond

// epoch is the origin of checkedConn's monotonic timestamps.
var epoch = time.Now()

// sinceEpoch is the monotonic time since epoch.
func sinceEpoch() int64 { return int64(time.Since(epoch)) }

// checkedDialer returns dial with each connection it makes that go-redis
// can health-check (a socket: TCP or Unix; not TLS, which go-redis never
// checks) wrapped in a checkedConn.
func checkedDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc, ok := c.(syscall.Conn)
		if !ok {
			return c, nil
		}
		cc := &checkedConn{Conn: c, sc: sc}
		cc.raw.c = cc
		cc.last.Store(sinceEpoch())
		return cc, nil
	}
}

// checkedConn is a connection on which go-redis's health check runs only
// after idleCheck or more without a read or write. go-redis checks a pooled
// connection each time it takes it from the pool, with a non-blocking
// peek (a system call) on its socket, so that a connection the server
// closed while it sat idle (a Redis restart) is dropped before a call is
// written on it. A connection that was read or written less than
// idleCheck ago was answered then: the check would cost a system call on
// every command, on a lone caller's every decision, to find what the call
// itself finds as fast, a connection that broke while in use, which
// go-redis then drops.
type checkedConn struct {
	net.Conn
	sc   syscall.Conn // Conn, as go-redis's check sees it
	raw  checkedRaw
	last atomic.Int64 // sinceEpoch at the end of the last read or write
}

func (c *checkedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.last.Store(sinceEpoch())
	return n, err
}

func (c *checkedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.last.Store(sinceEpoch())
	return n, err
}

// SyscallConn is what go-redis's health check uses: its Read runs the
// check, f, only on a connection idle for idleCheck or more.
func (c *checkedConn) SyscallConn() (syscall.RawConn, error) { return &c.raw, nil }

// checkedRaw is checkedConn's syscall.RawConn.
type checkedRaw struct{ c *checkedConn }

func (r *checkedRaw) Read(f func(fd uintptr) bool) error {
	if sinceEpoch()-r.c.last.Load() < int64(idleCheck) {
		return nil // used just now: f is not run, and finds nothing wrong
	}
	raw, err := r.c.sc.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Read(f)
}

func (r *checkedRaw) Write(f func(fd uintptr) bool) error {
	raw, err := r.c.sc.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Write(f)
}

func (r *checkedRaw) Control(f func(fd uintptr)) error {
	raw, err := r.c.sc.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Control(f)
}

package rueidis

import (
	"errors"
	"net"
	"sync"
	"time"
)

// errStale reports a pooled connection found closed by the server before a
// call was written on it: nothing was sent, so the call may be sent again.
var errStale = errors.New("rueidis: connection closed by the server while idle")

// idleCheck is how long a connection must have been idle before a write
// checks that the server has not closed it.
const idleCheck = time.Millisecond

// checkedConn is a connection that, before a write that follows idleCheck
// or more without a read or write, checks without blocking that the
// server has not closed it, as go-redis checks an idle pooled connection,
// and refuses the write with errStale when it has. The pooled connections
// of lone calls have no reader goroutine that would see a server close
// them (a Redis restart), so without the check the first call after a
// restart would fail on one. A connection with a read in progress (the
// pipelined connection's reader) is not checked: its reader sees a close.
type checkedConn struct {
	net.Conn
	raw     net.Conn // the socket under Conn, which is checked
	mu      sync.Mutex
	reading bool
	last    time.Time
}

func (c *checkedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.reading, c.last = false, time.Now()
	c.mu.Unlock()
	return n, err
}

func (c *checkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.reading && time.Since(c.last) >= idleCheck {
		// Holding mu: no read starts meanwhile, and the check's own
		// non-blocking read does not wait behind one.
		if err := peerClosed(c.raw); err != nil {
			c.mu.Unlock()
			return 0, errors.Join(errStale, err)
		}
	}
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.last = time.Now()
	c.mu.Unlock()
	return n, err
}

package rueidis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// dialFunc is the shape of rueidis.ClientOption.DialCtxFn.
type dialFunc func(ctx context.Context, dst string, d *net.Dialer, tlsCfg *tls.Config) (net.Conn, error)

// errNoAnswer reports a server that accepted a connection but did not
// answer PING: stopped, swapping, or black-holed behind a proxy.
var errNoAnswer = errors.New("rueidis: server accepted the connection but did not answer PING")

// probing wraps dial so that a new connection is handed to rueidis only once
// the server has answered an inline PING within the dial deadline.
//
// Why: rueidis runs its HELLO handshake on the caller's goroutine, and when
// the handshake times out it closes the half-made connection with a Close
// that can wait up to one second for a background goroutine (a race inside
// rueidis v1.0.79, pipe.go _newPipe → Close). Against a stalled server that
// second lands on a request that had a 50 ms deadline. A server that answers
// the probe is unlikely to stall during the handshake that follows at once.
//
// With checked, each connection is a checkedConn: the lone calls' pooled
// connections, which have no reader goroutine.
func probing(dial dialFunc, checked bool) dialFunc {
	if dial == nil {
		dial = dialTCP
	}
	return func(ctx context.Context, dst string, d *net.Dialer, tlsCfg *tls.Config) (net.Conn, error) {
		if d.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d.Timeout)
			defer cancel()
		}
		deadline, _ := ctx.Deadline() // zero, no deadline, if neither sets one
		conn, err := dial(ctx, dst, d, tlsCfg)
		if err != nil {
			return nil, err
		}
		if checked {
			conn = check(conn)
		}
		if err := ping(conn, deadline); err != nil {
			conn.Close()
			return nil, fmt.Errorf("%w: %s: %w", errNoAnswer, dst, err)
		}
		return conn, nil
	}
}

// dialTCP is rueidis's own dialer: TCP, with TLS when configured.
func dialTCP(ctx context.Context, dst string, d *net.Dialer, tlsCfg *tls.Config) (net.Conn, error) {
	if tlsCfg != nil {
		return (&tls.Dialer{NetDialer: d, Config: tlsCfg}).DialContext(ctx, "tcp", dst)
	}
	return d.DialContext(ctx, "tcp", dst)
}

// check returns conn as a checkedConn. A TLS connection is checked on the
// connection under it: a server's close or reset shows there as on a
// plain connection, and a peek disturbs nothing.
func check(conn net.Conn) net.Conn {
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	return &checkedConn{Conn: conn, raw: raw}
}

// ping sends an inline PING and reads one reply line. Any status or error
// line (+PONG, or -NOAUTH before authentication) proves the server is
// serving; the connection is left with nothing unread.
func ping(conn net.Conn, deadline time.Time) error {
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	var line [128]byte
	for n := 0; n < len(line); n++ {
		// Byte by byte: the reply is short, and a buffered read could
		// swallow bytes that belong to rueidis.
		if _, err := conn.Read(line[n : n+1]); err != nil {
			return err
		}
		if line[n] == '\n' {
			if line[0] != '+' && line[0] != '-' {
				return fmt.Errorf("unexpected reply %q", line[:n+1])
			}
			return conn.SetDeadline(time.Time{})
		}
	}
	return fmt.Errorf("reply longer than %d bytes", len(line))
}

//go:build unix

package rueidis

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// peerClosed reports, without blocking, whether the peer of conn has
// closed it (io.EOF) or reset it; nil when it is open or cannot be told.
// It peeks: a byte waiting is left unread.
func peerClosed(conn net.Conn) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var closed error
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n == 0 && err == nil:
			closed = io.EOF
		case err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR):
			closed = err
		}
		return true
	})
	if err != nil {
		return err
	}
	return closed
}

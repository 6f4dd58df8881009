//go:build !unix

package rueidis

import "net"

// peerClosed cannot tell here: nil.
func peerClosed(net.Conn) error { return nil }

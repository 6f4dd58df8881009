// Package redisprobe asks a redis-server started by holdfast's tests or its
// demo whether it is ready, and whether it is the process that was started:
// between choosing a free port and binding it, a server may find the port
// taken by another and exit, while that other one answers PING.
package redisprobe

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// A State is what Probe finds on an address.
type State int

const (
	Silent     State = iota // no answer, or not ready yet (LOADING)
	Ready                   // PONG, from the process expected
	Foreign                 // PONG, from another process
	Unverified              // NOAUTH: a server that wants a password Probe was not given
)

// Probe sends AUTH (when password is not empty), PING and INFO server to
// addr over one connection (TLS with tc when it is not nil), and reports
// whether the server answered PONG and, from INFO's process_id, whether it
// is process pid.
func Probe(addr string, tc *tls.Config, password string, pid int) State {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return Silent
	}
	if tc != nil {
		c = tls.Client(c, tc)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	var req strings.Builder
	if password != "" {
		fmt.Fprintf(&req, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(password), password)
	}
	req.WriteString("PING\r\nINFO server\r\n")
	if _, err := c.Write([]byte(req.String())); err != nil {
		return Silent
	}
	r := bufio.NewReader(c)
	if password != "" {
		if _, err := r.ReadString('\n'); err != nil {
			return Silent
		}
	}
	line, err := r.ReadString('\n')
	switch {
	case err != nil:
		return Silent
	case strings.HasPrefix(line, "-NOAUTH"):
		return Unverified
	case line != "+PONG\r\n":
		return Silent
	}
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return Silent
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n <= 0 {
		return Silent
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return Silent
	}
	if strings.Contains(string(body), "\r\nprocess_id:"+strconv.Itoa(pid)+"\r\n") {
		return Ready
	}
	return Foreign
}

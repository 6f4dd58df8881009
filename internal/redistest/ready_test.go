package redistest

import (
	"strings"
	"testing"
)

// TestReadyIsThisServer: a server whose port another server took between
// freePort and its bind exits on "Address already in use" while the other
// answers PING; starting it must fail (and Start then tries another port),
// not return a Server whose address is the other's.
func TestReadyIsThisServer(t *testing.T) {
	t.Parallel()
	for _, password := range []string{"", "pw"} {
		var opts []Option
		if password != "" {
			opts = append(opts, WithPassword(password))
		}
		other := Start(t, opts...)
		s := &Server{bin: other.bin, dir: t.TempDir(), port: other.port}
		s.conf.password = password
		s.mu.Lock()
		err := s.startLocked()
		s.mu.Unlock()
		if err == nil {
			t.Fatalf("password %q: a server on the port of another (%s) started", password, other.Addr())
		}
		if !strings.Contains(err.Error(), "another server answers") && !strings.Contains(err.Error(), "exited") {
			t.Fatalf("password %q: start error %v, want another server answering or an exit", password, err)
		}
		other.Do(t, "PING") // the other server is untouched
	}
}

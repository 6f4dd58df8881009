package redistest

import (
	"fmt"
	"os"
	"os/exec"
)

// StartMain starts a redis-server as Start does, for a TestMain (where no
// testing.TB exists yet): its own temporary directory, a free 127.0.0.1
// port. stop stops it by PID and removes the directory.
func StartMain(opts ...Option) (srv *Server, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: redis-server not found on PATH (%v): run `make deps` or `apt-get install redis-server`", err)
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, nil, err
	}
	s := &Server{bin: bin, dir: dir}
	for _, o := range opts {
		o(&s.conf)
	}
	stop = func() {
		s.Stop()
		os.RemoveAll(dir)
	}
	for range startAttempts {
		port, perr := freePort()
		if perr != nil {
			stop()
			return nil, nil, perr
		}
		s.mu.Lock()
		s.port = port
		err = s.startLocked()
		s.mu.Unlock()
		if err == nil {
			return s, stop, nil
		}
	}
	stop()
	return nil, nil, fmt.Errorf("redistest: start redis-server: %w", err)
}

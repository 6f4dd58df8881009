package redistest_test

import (
	"net"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/redistest"
)

func TestStartAndDo(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING = %q, want PONG", got)
	}
	if got := s.Do(t, "CONFIG", "GET", "bind"); got != "map[bind:127.0.0.1]" && got != "[bind 127.0.0.1]" {
		t.Fatalf("CONFIG GET bind = %q", got)
	}
	if got := s.Do(t, "GET", "missing"); got != "" {
		t.Fatalf("GET missing = %q, want empty", got)
	}
}

func TestRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []redistest.Option
		want string
	}{
		{"aof_keeps_data", []redistest.Option{redistest.WithAOF()}, "v"},
		{"no_aof_loses_data", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, tc.opts...)
			addr := s.Addr()
			s.Do(t, "SET", "k", "v")
			s.Kill()
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Fatalf("%s still accepts connections after Kill", addr)
			}
			s.Restart(t)
			if s.Addr() != addr {
				t.Fatalf("restarted on %s, want %s", s.Addr(), addr)
			}
			if got := s.Do(t, "GET", "k"); got != tc.want {
				t.Fatalf("GET k after restart = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	s.Pause()
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial a paused server: %v (the kernel should still accept)", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); err == nil {
		t.Fatalf("paused server answered %d bytes", n)
	}
	s.Resume()
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING after Resume = %q", got)
	}
}

func TestStopWhilePaused(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	s.Pause()
	s.Stop() // must resume first, or SIGTERM would wait for StopTimeout
	s.Restart(t)
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING after Restart = %q", got)
	}
}

func TestManyInParallel(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			s.Do(t, "SET", "i", string(rune('a'+i)))
			if got := s.Do(t, "GET", "i"); got != string(rune('a'+i)) {
				t.Fatalf("GET i = %q", got)
			}
		})
	}
}

func TestPassword(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.WithPassword("p@ss word"))
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}
	if want := "redis://:p%40ss%20word@" + s.Addr() + "/0"; s.URL() != want {
		t.Fatalf("URL = %s, want %s", s.URL(), want)
	}
}

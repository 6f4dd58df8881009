package toxitest_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/toxitest"
)

// echo starts a TCP echo server on a free loopback port, closed with its
// connections when the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c); c.Close() })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends msg and reads it back within wait; it returns how long
// that took.
func roundTrip(c net.Conn, msg []byte, wait time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(wait))
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, err
	}
	if !bytes.Equal(got, msg) {
		return 0, errors.New("echo differs")
	}
	return time.Since(start), nil
}

func TestPassThroughAndLatency(t *testing.T) {
	t.Parallel()
	px := toxitest.Start(t, echo(t))
	c := dial(t, px.Addr())
	if took, err := roundTrip(c, []byte("ping"), time.Second); err != nil || took > 100*time.Millisecond {
		t.Fatalf("plain round trip: %v, %v", took, err)
	}
	lat := px.AddLatency(100*time.Millisecond, 0, toxitest.Upstream, toxitest.Downstream)
	if took, err := roundTrip(c, []byte("ping"), 2*time.Second); err != nil || took < 200*time.Millisecond {
		t.Fatalf("round trip with 100 ms each way: %v, %v; want >= 200ms", took, err)
	}
	lat.Remove()
	if took, err := roundTrip(c, []byte("ping"), time.Second); err != nil || took > 100*time.Millisecond {
		t.Fatalf("round trip after removing the latency: %v, %v", took, err)
	}
}

func TestCutAndRestore(t *testing.T) {
	t.Parallel()
	px := toxitest.Start(t, echo(t))
	old := dial(t, px.Addr())
	if _, err := roundTrip(old, []byte("a"), time.Second); err != nil {
		t.Fatal(err)
	}
	px.Cut()
	px.Cut() // idempotent
	if _, err := roundTrip(old, []byte("b"), 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("open connection through a cut: %v, want a timeout", err)
	}
	fresh := dial(t, px.Addr()) // accepted, then black-holed
	if _, err := roundTrip(fresh, []byte("c"), 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection through a cut: %v, want a timeout", err)
	}
	px.Restore()
	if _, err := roundTrip(old, []byte("d"), time.Second); err == nil {
		t.Fatal("a connection open during the cut still works after it; want it closed")
	}
	if _, err := roundTrip(dial(t, px.Addr()), []byte("e"), time.Second); err != nil {
		t.Fatalf("new connection after Restore: %v", err)
	}
}

func TestDisableEnable(t *testing.T) {
	t.Parallel()
	px := toxitest.Start(t, echo(t))
	addr := px.Addr()
	px.Disable()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("dial to a disabled proxy succeeded")
	}
	px.Enable()
	if px.Addr() != addr {
		t.Fatalf("address changed across Enable: %s, was %s", px.Addr(), addr)
	}
	if _, err := roundTrip(dial(t, addr), []byte("x"), time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestBandwidthAndSlicer(t *testing.T) {
	t.Parallel()
	px := toxitest.Start(t, echo(t))
	c := dial(t, px.Addr())
	msg := []byte(strings.Repeat("x", 3000))
	bw := px.AddBandwidth(10) // 10 KB/s: 3000 bytes take 300 ms
	if took, err := roundTrip(c, msg, 3*time.Second); err != nil || took < 250*time.Millisecond {
		t.Fatalf("3000 bytes at 10 KB/s: %v, %v; want >= 250ms", took, err)
	}
	bw.Remove()
	sl := px.AddSlicer(10, 0, 10*time.Millisecond) // 100 bytes: 10 slices, 10 ms apart
	if took, err := roundTrip(c, msg[:100], 3*time.Second); err != nil || took < 80*time.Millisecond {
		t.Fatalf("100 bytes in 10-byte slices 10 ms apart: %v, %v; want >= 80ms", took, err)
	}
	sl.Remove()
	if took, err := roundTrip(c, msg, time.Second); err != nil || took > 100*time.Millisecond {
		t.Fatalf("after removing the toxics: %v, %v", took, err)
	}
}

func TestResetPeer(t *testing.T) {
	t.Parallel()
	px := toxitest.Start(t, echo(t))
	rst := px.ResetPeer(0)
	_, err := roundTrip(dial(t, px.Addr()), []byte("x"), time.Second)
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip through reset_peer: %v, want the connection reset", err)
	}
	rst.Remove()
	if _, err := roundTrip(dial(t, px.Addr()), []byte("y"), time.Second); err != nil {
		t.Fatalf("after removing reset_peer: %v", err)
	}
}

package rueidis_test

import (
	"net"
	"strings"
	"testing"
	"time"

	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestNewClientWhileDown(t *testing.T) {
	t.Parallel()
	paused := redistest.Start(t)
	paused.Pause()
	for _, url := range []string{"redis://" + closedAddr(t), paused.URL()} {
		start := time.Now()
		c, err := hfrueidis.NewClient(url, hfrueidis.ClientOptions{})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v; a single-node client must not need Redis up", url, err)
		}
		c.Close()
		if took > storetest.StallBound {
			t.Fatalf("%s: NewClient took %v, bound %v", url, took, storetest.StallBound)
		}
		t.Logf("%s: NewClient returned after %v", url, took)
	}
	paused.Resume()
}

func TestNewClientClusterWhileDown(t *testing.T) {
	t.Parallel()
	url := "redis://" + closedAddr(t) + "?addr=" + closedAddr(t)
	start := time.Now()
	c, err := hfrueidis.NewClient(url, hfrueidis.ClientOptions{})
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatalf("%s: cluster client without a reachable seed: no error", url)
	}
	if took > storetest.StallBound {
		t.Fatalf("%s: NewClient took %v, bound %v", url, took, storetest.StallBound)
	}
	t.Logf("%s: %v after %v", url, err, took)
}

func TestNewClientErrors(t *testing.T) {
	for _, tc := range []struct {
		url string
		o   hfrueidis.ClientOptions
	}{
		{"http://127.0.0.1:6379", hfrueidis.ClientOptions{}},
		{"redis://127.0.0.1:6379/x", hfrueidis.ClientOptions{}},
		{"redis://127.0.0.1:6379", hfrueidis.ClientOptions{ConnWriteTimeout: -1}},
		{"redis://127.0.0.1:6379", hfrueidis.ClientOptions{KeepAlive: -1}},
		{"redis://127.0.0.1:6379", hfrueidis.ClientOptions{PipelineMultiplex: -1}},
		{"redis://127.0.0.1:6379", hfrueidis.ClientOptions{PipelineMultiplex: 9}}, // rueidis's maximum is 8
		{"::", hfrueidis.ClientOptions{}},
	} {
		if c, err := hfrueidis.NewClient(tc.url, tc.o); err == nil {
			c.Close()
			t.Errorf("%q %+v: no error", tc.url, tc.o)
		}
	}
}

// TestURLErrorsHideSecrets: a malformed URL's error names the problem but
// never the password.
func TestURLErrorsHideSecrets(t *testing.T) {
	for _, u := range []string{"redis://:sekrit@127.0.0.1:bad/0", "rediss://user:sekrit@[::1", "redis://u:sekrit@h:1/zz"} {
		_, err := hfrueidis.NewClient(u, hfrueidis.ClientOptions{})
		if err == nil || strings.Contains(err.Error(), "sekrit") {
			t.Errorf("%s: %v", u, err)
		}
	}
}

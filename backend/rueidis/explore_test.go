package rueidis_test

import (
	"os"
	"runtime"
	"testing"
	"time"

	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/internal/redistest"
)

func TestExploreStall(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv.URL(), hfrueidis.ClientOptions{})
	wantOK(t, s, "healthy")
	srv.Pause()
	end := time.Now().Add(1500 * time.Millisecond)
	var worst time.Duration
	n := 0
	for time.Now().Before(end) {
		wd := time.AfterFunc(400*time.Millisecond, func() {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			os.WriteFile("/tmp/hfscratch/stack.txt", buf[:n], 0o644)
		})
		took, err := run(s, 50*time.Millisecond)
		wd.Stop()
		n++
		if took > worst {
			worst = took
		}
		if took > 100*time.Millisecond {
			t.Logf("call %d: %v after %v", n, err, took)
		}
	}
	t.Logf("%d calls, worst %v", n, worst)
	srv.Resume()
}

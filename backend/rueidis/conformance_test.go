package rueidis_test

import (
	"cmp"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	hfrueidis "github.com/holdfast/holdfast/backend/rueidis"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// harness makes rueidis stores for the storetest suites.
type harness struct{}

func (harness) NewStore(t testing.TB, url string, o storetest.StoreOptions) storetest.RedisStore {
	t.Helper()
	var co hfrueidis.ClientOptions
	if o.Relaxed {
		co = hfrueidis.ClientOptions{DialTimeout: 5 * time.Second, ConnWriteTimeout: 5 * time.Second, KeepAlive: time.Second}
	}
	if o.StallTimeout > 0 {
		// A call without a deadline waits until the health PING closes
		// the stalled connection: 2 × KeepAlive + ConnWriteTimeout at most.
		keepAlive := (o.StallTimeout - cmp.Or(co.ConnWriteTimeout, hfrueidis.DefaultConnWriteTimeout)) / 2
		if keepAlive <= 0 {
			t.Fatalf("stall timeout %v: too short for the health PING", o.StallTimeout)
		}
		co.KeepAlive = min(keepAlive, cmp.Or(co.KeepAlive, hfrueidis.DefaultKeepAlive))
	}
	c, err := hfrueidis.NewClient(url, co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return hfrueidis.NewWithOptions(c, hfrueidis.StoreOptions{KeysDepth: o.KeysDepth, KeysFrom: o.KeysFrom})
}

func (harness) IsReplyError(err error) bool {
	var rerr *rueidis.RedisError
	return errors.As(err, &rerr)
}

func (harness) SetPipelineSizing(chunk, workers int) func() {
	return hfrueidis.SetPipelineSizing(chunk, workers)
}

// TestRedis is not parallel: RunRedis runs its tests of timing and
// accuracy alone before the others.
func TestRedis(t *testing.T) { storetest.RunRedis(t, harness{}) }

func BenchmarkAllow(b *testing.B) {
	storetest.BenchAllow(b, harness{}.NewStore(b, redistest.Start(b).URL(), storetest.StoreOptions{}))
}

func BenchmarkRunMany(b *testing.B) { storetest.BenchRunMany(b, harness{}) }

func BenchmarkRunManyLiveLatency(b *testing.B) { storetest.BenchRunManyLiveLatency(b, harness{}) }

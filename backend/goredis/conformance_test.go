package goredis_test

import (
	"cmp"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/backend/goredis"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/storetest"
)

// harness makes go-redis stores for the storetest suites.
type harness struct{}

func (harness) NewStore(t testing.TB, url string, o storetest.StoreOptions) storetest.RedisStore {
	t.Helper()
	var co goredis.ClientOptions
	if o.Relaxed {
		co = goredis.ClientOptions{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, DialTimeout: 5 * time.Second}
	}
	if o.StallTimeout > 0 {
		// ReadTimeout bounds a call without a deadline.
		co.ReadTimeout = min(o.StallTimeout, cmp.Or(co.ReadTimeout, goredis.DefaultReadTimeout))
	}
	c, err := goredis.NewClient(url, co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return goredis.NewWithOptions(c, goredis.StoreOptions{KeysDepth: o.KeysDepth, KeysFrom: o.KeysFrom})
}

func (harness) IsReplyError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

func (harness) SetPipelineSizing(chunk, workers int) func() {
	return goredis.SetPipelineSizing(chunk, workers)
}

// TestRedis is not parallel: RunRedis runs its tests of timing and
// accuracy alone before the others.
func TestRedis(t *testing.T) { storetest.RunRedis(t, harness{}) }

func BenchmarkAllow(b *testing.B) {
	storetest.BenchAllow(b, harness{}.NewStore(b, redistest.Start(b).URL(), storetest.StoreOptions{}))
}

func BenchmarkRunMany(b *testing.B) { storetest.BenchRunMany(b, harness{}) }

func BenchmarkRunManyLiveLatency(b *testing.B) { storetest.BenchRunManyLiveLatency(b, harness{}) }

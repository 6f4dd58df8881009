package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/internal/redistest"
)

// TestClusterFailover: a 3-master, 3-replica cluster serves a key; killing
// the key's master promotes its replica and the key is served again.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cl.Close()
	ctx := context.Background()
	if err := cl.Set(ctx, "{k}x", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old := c.MasterFor(t, "{k}x")
	old.Kill()
	c.WaitPromoted(t, old, "{k}x", 30*time.Second)
	cl.ReloadState(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cl.Set(ctx, "{k}y", "2", 0).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster did not serve the slot after failover: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

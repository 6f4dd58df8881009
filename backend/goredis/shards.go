package goredis

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var _ driver.Sharded = (*Store)(nil)

// Shards returns the cluster's shards from CLUSTER SLOTS, grouped by master;
// nil when the client is not a cluster client.
func (s *Store) Shards(ctx context.Context) ([]driver.Shard, error) {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return nil, nil
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, classify("CLUSTER SLOTS", err)
	}
	ranges := make([]driver.ShardSlots, 0, len(slots))
	for _, sl := range slots {
		if len(sl.Nodes) == 0 {
			return nil, driver.Errorf(core.ErrMalformedReply, "CLUSTER SLOTS: range %d-%d has no master", sl.Start, sl.End)
		}
		id := sl.Nodes[0].ID
		if id == "" {
			id = sl.Nodes[0].Addr
		}
		ranges = append(ranges, driver.ShardSlots{Master: id, Range: driver.SlotRange{Start: sl.Start, End: sl.End}})
	}
	return driver.GroupShards(ranges)
}

// OnCluster reports whether the client is a Redis Cluster client.
func (s *Store) OnCluster() bool {
	_, ok := s.c.(*redis.ClusterClient)
	return ok
}

var _ driver.ClusterReporter = (*Store)(nil)

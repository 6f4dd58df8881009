package rueidis

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var _ driver.Sharded = (*Store)(nil)

// Shards returns the cluster's shards from CLUSTER SLOTS, grouped by master;
// nil when the client is not a cluster client.
func (s *Store) Shards(ctx context.Context) ([]driver.Shard, error) {
	if s.c.Mode() != rueidis.ClientModeCluster {
		return nil, nil
	}
	res := s.c.Do(ctx, s.c.B().ClusterSlots().Build())
	if err := res.Error(); err != nil {
		return nil, classify("CLUSTER SLOTS", err)
	}
	rows, err := res.ToArray()
	if err != nil {
		return nil, driver.Errorf(core.ErrMalformedReply, "CLUSTER SLOTS: %v", err)
	}
	ranges := make([]driver.ShardSlots, 0, len(rows))
	for _, row := range rows {
		r, err := slotRow(row)
		if err != nil {
			return nil, driver.Errorf(core.ErrMalformedReply, "CLUSTER SLOTS: %v", err)
		}
		ranges = append(ranges, r)
	}
	return driver.GroupShards(ranges)
}

// slotRow reads one CLUSTER SLOTS entry: start, end, then the master as
// [ip, port, id, ...] and its replicas.
func slotRow(row rueidis.RedisMessage) (driver.ShardSlots, error) {
	f, err := row.ToArray()
	if err != nil {
		return driver.ShardSlots{}, err
	}
	if len(f) < 3 {
		return driver.ShardSlots{}, errShort
	}
	start, err := f[0].AsInt64()
	if err != nil {
		return driver.ShardSlots{}, err
	}
	end, err := f[1].AsInt64()
	if err != nil {
		return driver.ShardSlots{}, err
	}
	node, err := f[2].ToArray()
	if err != nil {
		return driver.ShardSlots{}, err
	}
	if len(node) < 2 {
		return driver.ShardSlots{}, errShort
	}
	id := ""
	if len(node) >= 3 {
		id, _ = node[2].ToString()
	}
	if id == "" {
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		id = host + ":" + strconv.FormatInt(port, 10)
	}
	return driver.ShardSlots{Master: id, Range: driver.SlotRange{Start: int(start), End: int(end)}}, nil
}

var errShort = errors.New("short slot entry")

// OnCluster reports whether the client is a Redis Cluster client.
func (s *Store) OnCluster() bool { return s.c.Mode() == rueidis.ClientModeCluster }

var _ driver.ClusterReporter = (*Store)(nil)
